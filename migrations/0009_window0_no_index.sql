-- Queues without a dedup window keep no transaction index.
--
-- The index upsert was two thirds of PostgreSQL's cost of a 100-message
-- push (pgbench: 1,844 push_segment_v1 calls/s with it, 5,722 without; the
-- index is the only per-message row and its hash keys land on random pages).
-- A queue with dedupWindowSeconds 0 never deduplicates, so the index only
-- served its acks; those now resolve through the broker's registry and, on a
-- miss, by decoding the segments around the group's cursor (ack_span_v1).
--
-- push_segment_v2 / push_segments_v2 take the v1 arguments and answer the v1
-- rows. For a queue with a window they are the v1 functions; for a window-0
-- queue they write no index entries (and so can find no duplicate). The v1
-- functions stay as they are for brokers of the previous version during a
-- rolling upgrade (what they index for a window-0 queue is still found: acks
-- try the index first).

-- push_segment_v1 (0002_push.sql) without the index step for window 0: the
-- offsets reserved on the partition row (its lock serializes the partition's
-- writers), the segment inserted, one success row.
CREATE FUNCTION queen.push_segment_v2(
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
    v_qid    bigint;
    v_count  integer := cardinality(p_hashes);
    v_pid    bigint;
    v_base   bigint;
    v_at     timestamptz;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue AND q.dedup_window_seconds = 0;
    IF v_qid IS NULL OR v_count IS NULL OR v_count = 0 THEN
        -- A window, a queue still to create, or a call v1 refuses.
        RETURN QUERY SELECT * FROM queen.push_segment_v1(p_queue, p_partition, p_hashes, p_blob);
        RETURN;
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
    INSERT INTO queen.segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
    VALUES (v_pid, v_base, v_base + v_count - 1, v_count, v_at, p_blob);
    RETURN QUERY SELECT v_pid, v_base, v_at, NULL::integer, NULL::bigint, NULL::bigint, NULL::bytea, 0;
END
$$;

-- push_segments_v1 (0007_push_group.sql) for window 0 is push_segments_v1
-- given no hashes: its index step then writes nothing and finds no duplicate.
CREATE FUNCTION queen.push_segments_v2(
    p_queue       text,
    p_partitions  text[],
    p_counts      integer[],
    p_blobs       bytea[],
    p_hash_seg    integer[],
    p_hash_pos    integer[],
    p_hashes      bigint[])
RETURNS TABLE (
    o_seg           integer,
    o_partition_id  bigint,
    o_base_offset   bigint,
    o_created_at    timestamptz,
    o_dup_index     integer,
    o_dup_offset    bigint,
    o_seg_base      bigint,
    o_seg_blob      bytea,
    o_window        integer)
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queen.queues q WHERE q.name = p_queue AND q.dedup_window_seconds = 0) THEN
        RETURN QUERY SELECT * FROM queen.push_segments_v1(p_queue, p_partitions, p_counts, p_blobs, '{}', '{}', '{}');
    ELSE
        RETURN QUERY SELECT * FROM queen.push_segments_v1(p_queue, p_partitions, p_counts, p_blobs,
                                                          p_hash_seg, p_hash_pos, p_hashes);
    END IF;
END
$$;

-- The segments an ack may name when neither the broker's registry (another
-- broker popped the batch, a restart, an eviction) nor the index (a window-0
-- queue, or a hash purged while leased) knows its transactionId: those
-- overlapping [committed + 1 - p_slack, hi], hi being the group's batch_end or
-- committed + p_slack, whichever is higher, so the leased batch, a lease-less
-- ack just past the cursor and a retried ack just below it all resolve.
-- Bounded by the slack and the batch, never by the log.
CREATE FUNCTION queen.ack_span_v1(p_partition_id bigint, p_group text, p_slack integer)
RETURNS TABLE (o_base_offset bigint, o_blob bytea)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_committed  bigint;
    v_batch_end  bigint;
    v_lo         bigint;
    v_hi         bigint;
BEGIN
    SELECT c.committed, c.batch_end INTO v_committed, v_batch_end
    FROM queen.consumers c WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group;
    v_committed := COALESCE(v_committed, -1);
    v_lo := v_committed + 1 - p_slack;
    v_hi := GREATEST(COALESCE(v_batch_end, -1), v_committed + p_slack);
    -- Start at the segment covering v_lo (a backward key step), not at the
    -- partition's first segment.
    v_lo := COALESCE((SELECT s.base_offset FROM queen.segments s
                      WHERE s.partition_id = p_partition_id AND s.base_offset <= v_lo
                      ORDER BY s.base_offset DESC LIMIT 1), v_lo);
    RETURN QUERY
    SELECT s.base_offset, s.blob FROM queen.segments s
    WHERE s.partition_id = p_partition_id AND s.base_offset BETWEEN v_lo AND v_hi
    ORDER BY s.base_offset;
END
$$;
