-- The push path: one call per coalesced segment (ARCHITECTURE.md §3).

-- Implicit queue creation, the one home of the label rule: namespace is the
-- part of the name before the first dot (the whole name without one), task
-- the second dot-separated part or ''. Implicit queues lease for 60 s.
CREATE FUNCTION queen.ensure_queue_v1(p_queue text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    SELECT id INTO v_id FROM queen.queues WHERE name = p_queue;
    IF v_id IS NULL THEN
        INSERT INTO queen.queues (name, namespace, task, lease_time)
        VALUES (p_queue, split_part(p_queue, '.', 1), split_part(p_queue, '.', 2), 60)
        ON CONFLICT (name) DO NOTHING
        RETURNING id INTO v_id;
        IF v_id IS NULL THEN
            SELECT id INTO v_id FROM queen.queues WHERE name = p_queue;
        END IF;
    END IF;
    RETURN v_id;
END
$$;

-- Appends one segment of cardinality(p_hashes) frames to (queue, partition).
--
-- p_hashes[i] is the 64-bit hash of frame i's transactionId. When the queue
-- keeps a dedup window the broker has already merged equal transactionIds
-- inside the batch. The common path is four statements: read the queue,
-- reserve gap-free offsets on the partition row (its lock serializes every
-- writer of the partition), upsert the index entries, insert the segment.
--
-- Deduplication rides on the index upsert: an entry still inside the window
-- is left alone, so it is missing from the upsert's count. Then (the rare
-- path) nothing is kept: the entries just written are removed, the offsets
-- given back, and one row per duplicate comes back (o_dup_index, the existing
-- offset, and the segment that should hold it, so the broker can report the
-- original message id). The broker drops those items and calls again.
--
-- On success one row comes back: partition id, base offset, and the
-- segment's created_at = GREATEST(clock_timestamp(), previous last_write_at)
-- taken under the lock, which keeps created_at monotone in base_offset. Every
-- row also carries the queue's dedup window, so the broker knows whether to
-- merge equal transactionIds of concurrent requests.
CREATE FUNCTION queen.push_segment_v1(
    p_queue      text,
    p_partition  text,
    p_hashes     bigint[],
    p_blob       bytea)
RETURNS TABLE (
    o_partition_id  bigint,
    o_base_offset   bigint,
    o_created_at    timestamptz,
    o_dup_index     integer,
    o_dup_offset    bigint,
    o_seg_base      bigint,
    o_seg_blob      bytea,
    o_window        integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_qid      bigint;
    v_window   integer;
    v_pid      bigint;
    v_count    integer := cardinality(p_hashes);
    v_base     bigint;
    v_at       timestamptz;
    v_written  integer;
BEGIN
    IF v_count IS NULL OR v_count = 0 THEN
        RAISE EXCEPTION 'push_segment_v1: empty segment';
    END IF;
    SELECT q.id, q.dedup_window_seconds INTO v_qid, v_window FROM queen.queues q WHERE q.name = p_queue;
    IF v_qid IS NULL THEN
        v_qid := queen.ensure_queue_v1(p_queue);
        SELECT q.dedup_window_seconds INTO v_window FROM queen.queues q WHERE q.id = v_qid;
    END IF;

    FOR attempt IN 1..2 LOOP
        UPDATE queen.partitions p
        SET last_offset = p.last_offset + v_count,
            last_write_at = GREATEST(clock_timestamp(), COALESCE(p.last_write_at, '-infinity'))
        WHERE p.queue_id = v_qid AND p.name = p_partition
        RETURNING p.id, p.last_offset - v_count + 1, p.last_write_at INTO v_pid, v_base, v_at;
        EXIT WHEN v_pid IS NOT NULL;
        INSERT INTO queen.partitions (queue_id, name) VALUES (v_qid, p_partition)
        ON CONFLICT (queue_id, name) DO NOTHING;
    END LOOP;

    -- DISTINCT ON keeps the first of equal hashes (equal transactionIds on a
    -- queue without window, or a 64-bit collision), which an upsert could not
    -- touch twice.
    WITH written AS (
        INSERT INTO queen.txn_index AS t (partition_id, txn_hash, msg_offset, created_at)
        SELECT DISTINCT ON (h.hash) v_pid, h.hash, v_base + h.ord - 1, v_at
        FROM unnest(p_hashes) WITH ORDINALITY AS h (hash, ord)
        ORDER BY h.hash, h.ord
        ON CONFLICT (partition_id, txn_hash) DO UPDATE
            SET msg_offset = EXCLUDED.msg_offset, created_at = EXCLUDED.created_at
            WHERE v_window = 0 OR t.created_at <= EXCLUDED.created_at - make_interval(secs => v_window)
        RETURNING 1)
    SELECT count(*) INTO v_written FROM written;

    IF v_window > 0 AND v_written < v_count THEN
        RETURN QUERY
        SELECT v_pid, NULL::bigint, NULL::timestamptz, (h.ord - 1)::integer, t.msg_offset,
               s.base_offset, s.blob, v_window
        FROM unnest(p_hashes) WITH ORDINALITY AS h (hash, ord)
        JOIN queen.txn_index t ON t.partition_id = v_pid AND t.txn_hash = h.hash
        LEFT JOIN LATERAL (
            SELECT s.base_offset, s.blob FROM queen.segments s
            WHERE s.partition_id = v_pid AND s.base_offset <= t.msg_offset
            ORDER BY s.base_offset DESC LIMIT 1
        ) s ON true
        WHERE t.msg_offset NOT BETWEEN v_base AND v_base + v_count - 1;
        IF FOUND THEN
            DELETE FROM queen.txn_index t
            WHERE t.partition_id = v_pid AND t.txn_hash = ANY (p_hashes)
              AND t.msg_offset BETWEEN v_base AND v_base + v_count - 1;
            UPDATE queen.partitions p SET last_offset = p.last_offset - v_count WHERE p.id = v_pid;
            RETURN;
        END IF;
    END IF;

    INSERT INTO queen.segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
    VALUES (v_pid, v_base, v_base + v_count - 1, v_count, v_at, p_blob);

    RETURN QUERY SELECT v_pid, v_base, v_at, NULL::integer, NULL::bigint, NULL::bigint, NULL::bytea, v_window;
END
$$;
