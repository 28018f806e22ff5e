-- Idempotent Kafka producers, durable (issue 48, docs/KAFKA.md).
--
-- A producer's batches carry (producer id, epoch, first sequence, count).
-- Until now each broker kept the last five batches of every (producer,
-- topic, partition) in its memory: a restart, or the producer's move to
-- another broker, forgot them, and a batch whose answer was lost across
-- it was written twice. Here they live beside the log they protect, and a
-- batch's window is read, checked and advanced in the transaction that
-- writes its records (src/kafka/idempotence.rs): a resend is answered with
-- its original offset by whichever broker it reaches, whenever.
--
-- Invariants:
-- * A producer's produces serialize on its kafka_producers row
--   (queen.kafka_produce_begin_v1 locks it first), so two brokers given
--   the same resend at once cannot both find it new.
-- * A window's arrays hold the producer's last five batches on that
--   partition under one epoch, oldest first, parallel: batch i is
--   sequences first_seqs[i]..last_seqs[i] at offsets from offsets[i].
-- * epoch is the producer's current epoch: InitProducerId raises it
--   (KIP-360), and a batch of an older one is refused (a fenced zombie).
-- * A producer idle longer than the expiry (QUEEN_KAFKA_PRODUCER_ID_EXPIRATION_MS)
--   is deleted with its windows by queen.kafka_producers_expire_v1, a
--   bounded batch per maintenance tick: storage follows the producers in use.

CREATE TABLE queen.kafka_producers (
    producer_id  bigint PRIMARY KEY,
    epoch        smallint NOT NULL CHECK (epoch >= 0),
    touched_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE queen.kafka_producer_windows (
    producer_id  bigint NOT NULL REFERENCES queen.kafka_producers (producer_id) ON DELETE CASCADE,
    queue        text NOT NULL,
    partition    text NOT NULL,
    epoch        smallint NOT NULL,
    first_seqs   integer[] NOT NULL,
    last_seqs    integer[] NOT NULL,
    offsets      bigint[] NOT NULL,
    PRIMARY KEY (producer_id, queue, partition)
);

-- InitProducerId without a transactional id. p_producer < 0: a new id
-- under epoch 0. Otherwise KIP-360's bump of (p_producer, p_epoch): the
-- next epoch; the same answer again when the bump is retried (p_epoch one
-- below the current); a new id when the epoch would overflow; o_epoch -1
-- when p_epoch is neither current nor the one before (another session of
-- the producer bumped it: the caller is fenced). A producer unknown here
-- (expired, or from before this migration) is taken at p_epoch + 1.
CREATE FUNCTION queen.kafka_init_producer_v1(p_producer bigint, p_epoch smallint)
RETURNS TABLE (o_producer bigint, o_epoch smallint)
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch smallint;
BEGIN
    IF p_producer >= 0 AND p_epoch >= 0 AND p_epoch < 32766 THEN
        INSERT INTO queen.kafka_producers (producer_id, epoch) VALUES (p_producer, p_epoch + 1)
        ON CONFLICT (producer_id) DO UPDATE SET
            epoch = CASE WHEN kafka_producers.epoch = p_epoch THEN p_epoch + 1 ELSE kafka_producers.epoch END,
            touched_at = now()
        RETURNING epoch INTO v_epoch;
        IF v_epoch = p_epoch + 1 THEN
            RETURN QUERY SELECT p_producer, v_epoch;
        ELSE
            RETURN QUERY SELECT p_producer, (-1)::smallint;
        END IF;
        RETURN;
    END IF;
    o_producer := nextval('queen.kafka_producer_ids');
    INSERT INTO queen.kafka_producers (producer_id, epoch) VALUES (o_producer, 0);
    RETURN QUERY SELECT o_producer, 0::smallint;
END $$;

-- The start of a produce of p_producer's batches to (p_queues[i],
-- p_partitions[i]), inside the transaction that writes them: locks the
-- producer (registering it under p_epoch when unknown), and answers its
-- current epoch with each partition's window (nulls where it has none),
-- and the partition's id and last offset as read now (nulls where it does
-- not exist yet): the write of records whose ids the broker minted skips
-- the dedup check from there (src/push/coalescer.rs, InSegment::tail).
CREATE FUNCTION queen.kafka_produce_begin_v1(p_producer bigint, p_epoch smallint, p_queues text[], p_partitions text[])
RETURNS TABLE (o_epoch smallint, o_window_epoch smallint, o_firsts integer[], o_lasts integer[], o_offsets bigint[],
               o_partition_id bigint, o_last_offset bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch smallint;
    v_touched timestamptz;
BEGIN
    SELECT epoch, touched_at INTO v_epoch, v_touched FROM queen.kafka_producers WHERE producer_id = p_producer FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO queen.kafka_producers (producer_id, epoch) VALUES (p_producer, greatest(p_epoch, 0))
        ON CONFLICT (producer_id) DO NOTHING;
        SELECT epoch, touched_at INTO v_epoch, v_touched FROM queen.kafka_producers WHERE producer_id = p_producer FOR UPDATE;
    ELSIF v_touched < now() - interval '1 minute' THEN
        -- Expiry needs only minutes' precision: a busy producer writes its row once a minute.
        UPDATE queen.kafka_producers SET touched_at = now() WHERE producer_id = p_producer;
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

-- The end of that produce, before its COMMIT: each written batch joins its
-- partition's window (a new epoch starts the window afresh; the oldest of
-- six is dropped), and an epoch above the producer's (a producer from
-- before this migration, bumped by a broker that did not record it)
-- becomes its epoch.
CREATE FUNCTION queen.kafka_produce_record_v1(
    p_producer bigint, p_epoch smallint, p_queues text[], p_partitions text[], p_firsts integer[], p_lasts integer[], p_offsets bigint[])
RETURNS void
LANGUAGE sql AS $$
    UPDATE queen.kafka_producers SET epoch = p_epoch WHERE producer_id = p_producer AND epoch < p_epoch;
    INSERT INTO queen.kafka_producer_windows AS w (producer_id, queue, partition, epoch, first_seqs, last_seqs, offsets)
    SELECT p_producer, b.queue, b.partition, p_epoch, ARRAY[b.first], ARRAY[b.last], ARRAY[b.off]
    FROM unnest(p_queues, p_partitions, p_firsts, p_lasts, p_offsets) AS b (queue, partition, first, last, off)
    ON CONFLICT (producer_id, queue, partition) DO UPDATE SET
        epoch = excluded.epoch,
        first_seqs = CASE WHEN w.epoch = excluded.epoch THEN (w.first_seqs || excluded.first_seqs)[greatest(1, cardinality(w.first_seqs) - 3):]
                          ELSE excluded.first_seqs END,
        last_seqs  = CASE WHEN w.epoch = excluded.epoch THEN (w.last_seqs || excluded.last_seqs)[greatest(1, cardinality(w.last_seqs) - 3):]
                          ELSE excluded.last_seqs END,
        offsets    = CASE WHEN w.epoch = excluded.epoch THEN (w.offsets || excluded.offsets)[greatest(1, cardinality(w.offsets) - 3):]
                          ELSE excluded.offsets END;
$$;

-- Deletes up to p_batch producers idle for p_idle_seconds, with their
-- windows; one busy producing is skipped (its row is locked) and stays.
-- Answers how many went.
CREATE FUNCTION queen.kafka_producers_expire_v1(p_idle_seconds bigint, p_batch integer)
RETURNS bigint
LANGUAGE sql AS $$
    WITH idle AS (
        SELECT producer_id FROM queen.kafka_producers
        WHERE touched_at < now() - make_interval(secs => p_idle_seconds)
        LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM queen.kafka_producers p USING idle WHERE p.producer_id = idle.producer_id RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;
