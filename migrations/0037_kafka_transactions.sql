-- Kafka transactions, durable (issue 48, docs/KAFKA.md).
--
-- A transactional producer (a `transactional.id`) writes records to several
-- partitions and commits consumer-group offsets, then commits or aborts
-- the lot. Here a transaction's records are staged beside the log, as the
-- segments they will become, and its offsets beside the cursors; EndTxn's
-- commit moves both into place in one PostgreSQL transaction
-- (queen.kafka_txn_end_v1), and an abort deletes them. Nothing of an open
-- or aborted transaction is ever in the log, so every reader (a Kafka
-- consumer at either isolation level, an HTTP pop, a fetch) sees a
-- transaction's records all at once, at its commit, or never; the last
-- stable offset is the high watermark.
--
-- The stage is in the database, so a broker restart, or the producer
-- moving to another broker, in the middle of a transaction lets it commit
-- or abort afterwards.
--
-- Invariants:
-- * A transactional id names at most one producer row (unique). Its
--   InitProducerId aborts what that producer left open and bumps the
--   epoch, fencing every older session (a zombie's requests then fail on
--   the epoch).
-- * txn_state 1 (ongoing) exactly while the producer may stage: set by
--   AddPartitionsToTxn / AddOffsetsToTxn, cleared by EndTxn or by the
--   timeout (queen.kafka_txn_expire_v1, which also bumps the epoch).
-- * Staged rows exist only for an ongoing transaction and go with their
--   producer.

ALTER TABLE queen.kafka_producers
    ADD COLUMN transactional_id text UNIQUE,
    ADD COLUMN txn_state smallint NOT NULL DEFAULT 0,
    ADD COLUMN txn_timeout_ms integer NOT NULL DEFAULT 60000,
    ADD COLUMN txn_started_at timestamptz,
    -- How the last transaction ended (1 committed, 2 aborted), so an EndTxn
    -- retried after its answer was lost gets the same answer.
    ADD COLUMN txn_last_result smallint NOT NULL DEFAULT 0;

-- A transaction's records, as the segments they become at commit, in the
-- order they were produced.
CREATE TABLE queen.kafka_txn_segments (
    producer_id  bigint NOT NULL REFERENCES queen.kafka_producers (producer_id) ON DELETE CASCADE,
    n            bigint GENERATED ALWAYS AS IDENTITY,
    queue        text NOT NULL,
    partition    text NOT NULL,
    hashes       bigint[] NOT NULL,
    blob         bytea NOT NULL,
    PRIMARY KEY (producer_id, n)
);

-- A transaction's consumer-group offsets (TxnOffsetCommit), as cursors:
-- Kafka's committed offset k is the cursor k - 1.
CREATE TABLE queen.kafka_txn_offsets (
    producer_id     bigint NOT NULL REFERENCES queen.kafka_producers (producer_id) ON DELETE CASCADE,
    consumer_group  text NOT NULL,
    queue           text NOT NULL,
    partition       text NOT NULL,
    cursor          bigint NOT NULL,
    PRIMARY KEY (producer_id, consumer_group, queue, partition)
);

-- A group's cursors on (queue, partition) pairs, as Kafka's OffsetCommit
-- writes them and a transaction's commit applies them: clamped to the
-- partition's last offset, never touching a lease. Answers the positions
-- (1-based) of pairs that name no partition while committing past -1.
CREATE FUNCTION queen.kafka_commit_offsets_v1(p_group text, p_queues text[], p_partitions text[], p_cursors bigint[])
RETURNS SETOF bigint
LANGUAGE sql AS $$
    WITH x AS (SELECT * FROM unnest(p_queues, p_partitions, p_cursors) WITH ORDINALITY AS x (queue, partition, cursor, i)),
         w AS (INSERT INTO queen.consumers AS c (partition_id, consumer_group, committed, last_consumed_at)
               SELECT p.id, p_group, LEAST(x.cursor, p.last_offset), now()
               FROM x JOIN queen.queues q ON q.name = x.queue
               JOIN queen.partitions p ON p.queue_id = q.id AND p.name = x.partition
               ON CONFLICT (partition_id, consumer_group) DO UPDATE
                   SET committed = EXCLUDED.committed, last_consumed_at = EXCLUDED.last_consumed_at
               RETURNING c.partition_id)
    SELECT x.i FROM x
    WHERE x.cursor >= 0 AND NOT EXISTS (
        SELECT 1 FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id AND p.name = x.partition
        WHERE q.name = x.queue);
$$;

-- InitProducerId with a transactional id: the producer it names, with
-- whatever it left open aborted and its epoch bumped (a new id when the
-- epoch would overflow), or a new producer under epoch 0.
CREATE FUNCTION queen.kafka_init_transactional_v1(p_txn_id text, p_timeout_ms integer)
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
        INSERT INTO queen.kafka_producers (producer_id, epoch, transactional_id, txn_timeout_ms)
        VALUES (v_producer, 0, p_txn_id, p_timeout_ms)
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
        INSERT INTO queen.kafka_producers (producer_id, epoch, transactional_id, txn_timeout_ms)
        VALUES (v_producer, 0, p_txn_id, p_timeout_ms);
        RETURN QUERY SELECT v_producer, 0::smallint;
        RETURN;
    END IF;
    UPDATE queen.kafka_producers
    SET epoch = v_epoch + 1, txn_state = 0, txn_started_at = NULL, txn_timeout_ms = p_timeout_ms, touched_at = now(),
        txn_last_result = CASE WHEN txn_state = 1 THEN 2 ELSE txn_last_result END
    WHERE producer_id = v_producer;
    RETURN QUERY SELECT v_producer, (v_epoch + 1)::smallint;
END $$;

-- Locks the transactional producer and checks the caller is its current
-- session: 0, or Kafka's error code (49 INVALID_PRODUCER_ID_MAPPING: no
-- such transactional id or another producer id; 47 INVALID_PRODUCER_EPOCH:
-- a fenced session). With p_begin the transaction is (or stays) ongoing.
CREATE FUNCTION queen.kafka_txn_check_v1(p_txn_id text, p_producer bigint, p_epoch smallint, p_begin boolean)
RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
    v_producer bigint;
    v_epoch smallint;
    v_state smallint;
BEGIN
    SELECT producer_id, epoch, txn_state INTO v_producer, v_epoch, v_state
    FROM queen.kafka_producers WHERE transactional_id = p_txn_id FOR UPDATE;
    IF NOT FOUND OR v_producer <> p_producer THEN
        RETURN 49;
    END IF;
    IF v_epoch <> p_epoch THEN
        RETURN 47;
    END IF;
    IF p_begin AND v_state = 0 THEN
        UPDATE queen.kafka_producers SET txn_state = 1, txn_started_at = now(), touched_at = now() WHERE producer_id = v_producer;
    END IF;
    RETURN 0;
END $$;

-- Stages a transactional producer's segments, in order, inside the
-- transaction that checked its window (src/kafka/idempotence.rs).
CREATE FUNCTION queen.kafka_txn_stage_v1(p_producer bigint, p_queues text[], p_partitions text[], p_counts integer[],
                                         p_hashes bigint[], p_blobs bytea[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO queen.kafka_txn_segments (producer_id, queue, partition, hashes, blob)
    SELECT p_producer, s.queue, s.partition, p_hashes[(s.lo + 1)::integer : (s.lo + s.cnt)::integer], s.blob
    FROM (SELECT u.*, coalesce(sum(u.cnt) OVER (ORDER BY u.i ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS lo
          FROM unnest(p_queues, p_partitions, p_counts, p_blobs) WITH ORDINALITY AS u (queue, partition, cnt, blob, i)) s
    ORDER BY s.i;
$$;

-- Stages a transaction's offsets for p_group (TxnOffsetCommit): a later
-- commit of the same partition in the transaction replaces the earlier.
CREATE FUNCTION queen.kafka_txn_offsets_v1(p_producer bigint, p_group text, p_queues text[], p_partitions text[], p_cursors bigint[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO queen.kafka_txn_offsets (producer_id, consumer_group, queue, partition, cursor)
    SELECT p_producer, p_group, x.queue, x.partition, x.cursor
    FROM unnest(p_queues, p_partitions, p_cursors) AS x (queue, partition, cursor)
    ON CONFLICT (producer_id, consumer_group, queue, partition) DO UPDATE SET cursor = EXCLUDED.cursor;
$$;

-- EndTxn. Commit: the staged segments join the log in the order they were
-- produced (their ids were minted by the broker, so no dedup check is
-- needed: each call is told the partition's tail), the staged offsets
-- become the groups' cursors, and the stage is emptied, all in the
-- caller's transaction. Abort: the stage is emptied. The first row's
-- o_error is 0 or Kafka's error code (kafka_txn_check_v1's, or 48
-- INVALID_TXN_STATE when no transaction is open and the last did not end
-- the way asked: a retried EndTxn gets its first answer); the rows after
-- it name each partition written and how many records it got, for the
-- broker to wake its readers.
CREATE FUNCTION queen.kafka_txn_end_v1(p_txn_id text, p_producer bigint, p_epoch smallint, p_commit boolean)
RETURNS TABLE (o_error smallint, o_queue text, o_partition text, o_partition_id bigint, o_count bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_error smallint;
    v_state smallint;
    v_last smallint;
    v_want smallint := CASE WHEN p_commit THEN 1 ELSE 2 END;
    s record;
    g record;
    v_pid bigint;
    v_tail bigint;
    v_written bigint;
    w_queues text[] := '{}';
    w_partitions text[] := '{}';
    w_ids bigint[] := '{}';
    w_counts bigint[] := '{}';
BEGIN
    v_error := queen.kafka_txn_check_v1(p_txn_id, p_producer, p_epoch, false);
    IF v_error <> 0 THEN
        RETURN QUERY SELECT v_error, NULL::text, NULL::text, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    SELECT txn_state, txn_last_result INTO v_state, v_last FROM queen.kafka_producers WHERE producer_id = p_producer;
    IF v_state = 0 THEN
        RETURN QUERY SELECT CASE WHEN v_last = v_want THEN 0 ELSE 48 END::smallint, NULL::text, NULL::text, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT 0::smallint, NULL::text, NULL::text, NULL::bigint, NULL::bigint;
    IF p_commit THEN
        FOR s IN SELECT * FROM queen.kafka_txn_segments WHERE producer_id = p_producer ORDER BY n LOOP
            SELECT p.id, p.last_offset INTO v_pid, v_tail
            FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id AND p.name = s.partition WHERE q.name = s.queue;
            SELECT max(w.o_partition_id) INTO v_written
            FROM queen.push_segments_of_queues_v1(ARRAY[s.queue], ARRAY[s.partition], ARRAY[cardinality(s.hashes)], ARRAY[s.blob],
                                                  s.hashes, ARRAY[v_pid], ARRAY[v_tail], ARRAY[2147483647]) w;
            w_queues := w_queues || s.queue;
            w_partitions := w_partitions || s.partition;
            w_ids := w_ids || v_written;
            w_counts := w_counts || cardinality(s.hashes)::bigint;
        END LOOP;
        FOR g IN SELECT consumer_group, array_agg(queue) AS queues, array_agg(partition) AS partitions, array_agg(cursor) AS cursors
                 FROM queen.kafka_txn_offsets WHERE producer_id = p_producer GROUP BY consumer_group LOOP
            PERFORM queen.kafka_commit_offsets_v1(g.consumer_group, g.queues, g.partitions, g.cursors);
        END LOOP;
        RETURN QUERY SELECT 0::smallint, w.queue, w.partition, w.partition_id, sum(w.n)::bigint
                     FROM unnest(w_queues, w_partitions, w_ids, w_counts) AS w (queue, partition, partition_id, n)
                     GROUP BY w.queue, w.partition, w.partition_id;
    END IF;
    DELETE FROM queen.kafka_txn_segments WHERE producer_id = p_producer;
    DELETE FROM queen.kafka_txn_offsets WHERE producer_id = p_producer;
    UPDATE queen.kafka_producers SET txn_state = 0, txn_started_at = NULL, txn_last_result = v_want, touched_at = now()
    WHERE producer_id = p_producer;
END $$;

-- Aborts up to p_batch transactions open longer than their timeout, and
-- bumps each producer's epoch, as Kafka's coordinator does: the producer
-- learns of it on its next request (INVALID_PRODUCER_EPOCH) and starts
-- again. One being written to right now is skipped (its row is locked).
CREATE FUNCTION queen.kafka_txn_expire_v1(p_batch integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
BEGIN
    SELECT array_agg(producer_id) INTO v_ids FROM (
        SELECT producer_id FROM queen.kafka_producers
        WHERE txn_state = 1 AND txn_started_at + txn_timeout_ms * interval '1 millisecond' < now()
        LIMIT p_batch FOR UPDATE SKIP LOCKED) t;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    DELETE FROM queen.kafka_txn_segments WHERE producer_id = ANY (v_ids);
    DELETE FROM queen.kafka_txn_offsets WHERE producer_id = ANY (v_ids);
    UPDATE queen.kafka_producers
    SET txn_state = 0, txn_started_at = NULL, txn_last_result = 2, epoch = least(epoch + 1, 32767)
    WHERE producer_id = ANY (v_ids);
    RETURN cardinality(v_ids);
END $$;
