-- Kafka producers per tenant (issue 49, src/kafka/idempotence.rs): the
-- Kafka listener serves every tenant, and a producer id belongs to the
-- tenant whose connection was given it. Producer ids are a sequence anyone
-- can guess, so without this a client of one tenant could bump (KIP-360)
-- and so fence another tenant's producer.
-- * tenant_id: the producer's tenant. Rows from before this migration are
--   the default tenant's (the only one the listener served); a constant
--   default adds the column without rewriting the table.
-- * A bump of another tenant's producer gets a new producer id, as a bump
--   of an overflowing epoch does: the id answers as one never seen.
-- * A batch under another tenant's producer id is fenced
--   (INVALID_PRODUCER_EPOCH) and changes nothing of that producer.
-- Transactional ids need nothing here: the listener keeps them by the
-- tenant's stored name (src/tenancy), so two tenants' "t1" are two rows.

ALTER TABLE queen.kafka_producers
    ADD COLUMN tenant_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000001';

-- InitProducerId without a transactional id, for p_tenant: as
-- queen.kafka_init_producer_v1, and a bump of a producer another tenant
-- holds is answered with a new producer id.
CREATE FUNCTION queen.kafka_init_producer_v2(p_producer bigint, p_epoch smallint, p_tenant uuid)
RETURNS TABLE (o_producer bigint, o_epoch smallint)
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch smallint;
BEGIN
    IF p_producer >= 0 AND p_epoch >= 0 AND p_epoch < 32766 THEN
        INSERT INTO queen.kafka_producers (producer_id, epoch, tenant_id) VALUES (p_producer, p_epoch + 1, p_tenant)
        ON CONFLICT (producer_id) DO UPDATE SET
            epoch = CASE WHEN kafka_producers.epoch = p_epoch THEN p_epoch + 1 ELSE kafka_producers.epoch END,
            touched_at = now()
        WHERE kafka_producers.tenant_id = p_tenant
        RETURNING epoch INTO v_epoch;
        IF FOUND THEN
            IF v_epoch = p_epoch + 1 THEN
                RETURN QUERY SELECT p_producer, v_epoch;
            ELSE
                RETURN QUERY SELECT p_producer, (-1)::smallint;
            END IF;
            RETURN;
        END IF;
        -- Another tenant's producer: this caller gets an id of its own.
    END IF;
    o_producer := nextval('queen.kafka_producer_ids');
    INSERT INTO queen.kafka_producers (producer_id, epoch, tenant_id) VALUES (o_producer, 0, p_tenant);
    RETURN QUERY SELECT o_producer, 0::smallint;
END $$;

-- InitProducerId with a transactional id (already the tenant's stored
-- name), for p_tenant: as queen.kafka_init_transactional_v1, with the
-- tenant recorded on a producer it creates.
CREATE FUNCTION queen.kafka_init_transactional_v2(p_txn_id text, p_timeout_ms integer, p_tenant uuid)
RETURNS TABLE (o_producer bigint, o_epoch smallint)
LANGUAGE plpgsql AS $$
DECLARE
    v_producer bigint;
    v_epoch smallint;
BEGIN
    LOOP
        SELECT producer_id, epoch INTO v_producer, v_epoch FROM queen.kafka_producers WHERE transactional_id = p_txn_id FOR UPDATE;
        EXIT WHEN FOUND;
        v_producer := nextval('queen.kafka_producer_ids');
        INSERT INTO queen.kafka_producers (producer_id, epoch, transactional_id, txn_timeout_ms, tenant_id)
        VALUES (v_producer, 0, p_txn_id, p_timeout_ms, p_tenant)
        ON CONFLICT (transactional_id) DO NOTHING;
        IF FOUND THEN
            RETURN QUERY SELECT v_producer, 0::smallint;
            RETURN;
        END IF;
        -- Another broker registered it meanwhile: take that one.
    END LOOP;
    DELETE FROM queen.kafka_txn_segments WHERE producer_id = v_producer;
    DELETE FROM queen.kafka_txn_offsets WHERE producer_id = v_producer;
    IF v_epoch >= 32766 THEN
        UPDATE queen.kafka_producers SET transactional_id = NULL WHERE producer_id = v_producer;
        v_producer := nextval('queen.kafka_producer_ids');
        INSERT INTO queen.kafka_producers (producer_id, epoch, transactional_id, txn_timeout_ms, tenant_id)
        VALUES (v_producer, 0, p_txn_id, p_timeout_ms, p_tenant);
        RETURN QUERY SELECT v_producer, 0::smallint;
        RETURN;
    END IF;
    UPDATE queen.kafka_producers
    SET epoch = v_epoch + 1, txn_state = 0, txn_started_at = NULL, txn_timeout_ms = p_timeout_ms, touched_at = now(),
        txn_last_result = CASE WHEN txn_state = 1 THEN 2 ELSE txn_last_result END
    WHERE producer_id = v_producer;
    RETURN QUERY SELECT v_producer, (v_epoch + 1)::smallint;
END $$;

-- The start of a produce, for p_tenant: as queen.kafka_produce_begin_v1,
-- with a producer it registers recorded as p_tenant's, and another
-- tenant's producer answered under epoch 32767, above any epoch a batch
-- carries, so each of its batches is fenced and the producer untouched.
CREATE FUNCTION queen.kafka_produce_begin_v2(p_producer bigint, p_epoch smallint, p_queues text[], p_partitions text[], p_tenant uuid)
RETURNS TABLE (o_epoch smallint, o_window_epoch smallint, o_firsts integer[], o_lasts integer[], o_offsets bigint[],
               o_partition_id bigint, o_last_offset bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch smallint;
    v_touched timestamptz;
    v_tenant uuid;
BEGIN
    SELECT epoch, touched_at, tenant_id INTO v_epoch, v_touched, v_tenant FROM queen.kafka_producers WHERE producer_id = p_producer FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO queen.kafka_producers (producer_id, epoch, tenant_id) VALUES (p_producer, greatest(p_epoch, 0), p_tenant)
        ON CONFLICT (producer_id) DO NOTHING;
        SELECT epoch, touched_at, tenant_id INTO v_epoch, v_touched, v_tenant FROM queen.kafka_producers WHERE producer_id = p_producer FOR UPDATE;
    ELSIF v_tenant = p_tenant AND v_touched < now() - interval '1 minute' THEN
        -- Expiry needs only minutes' precision: a busy producer writes its row once a minute.
        UPDATE queen.kafka_producers SET touched_at = now() WHERE producer_id = p_producer;
    END IF;
    IF v_tenant <> p_tenant THEN
        RETURN QUERY
            SELECT 32767::smallint, NULL::smallint, NULL::integer[], NULL::integer[], NULL::bigint[], NULL::bigint, NULL::bigint
            FROM unnest(p_queues) AS l (queue);
        RETURN;
    END IF;
    RETURN QUERY
        SELECT v_epoch, w.epoch, w.first_seqs, w.last_seqs, w.offsets, p.id, p.last_offset
        FROM unnest(p_queues, p_partitions) WITH ORDINALITY AS l (queue, partition, n)
        LEFT JOIN queen.kafka_producer_windows w
               ON w.producer_id = p_producer AND w.queue = l.queue AND w.partition = l.partition
        LEFT JOIN queen.queues q ON q.name = l.queue
        LEFT JOIN queen.partitions p ON p.queue_id = q.id AND p.name = l.partition
        ORDER BY l.n;
END $$;
