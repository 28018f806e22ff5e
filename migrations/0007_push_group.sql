-- Group commit: many partitions' segments of one queue in one call.
--
-- push_segment_v1 costs PostgreSQL about as much CPU per call as four
-- single-row commits, so when a queue's partitions each hold only a message
-- or two (batch-1 producers spread over partitions) the broker is bound by
-- calls, not rows. This function takes the segments the broker has ready for
-- several partitions of one queue and writes them with one statement per step
-- instead of one call per segment: reserve every partition's offsets in one
-- UPDATE, upsert every index entry in one INSERT, insert every segment in one
-- INSERT. The semantics per segment are push_segment_v1's exactly.
--
-- Arguments, all parallel to the segment list (1-based ordinals):
--   p_partitions[s]  partition name of segment s (distinct: the broker sends
--                    at most one segment per partition per call)
--   p_counts[s]      number of frames in segment s
--   p_blobs[s]       the segment's zstd blob
-- and parallel to the flattened hash list (segment by segment):
--   p_hash_seg[k]    segment ordinal of hash k
--   p_hash_pos[k]    position of hash k inside its segment (0-based)
--   p_hashes[k]      64-bit hash of the frame's transactionId
--
-- Rows out: for a written segment, one row with o_seg, its partition, base
-- offset and created_at. For a segment refused as a duplicate (inside the
-- window), nothing of it is kept (its index entries removed, its offsets
-- given back) and one row per duplicate frame comes back as in
-- push_segment_v1; the other segments of the call are written regardless.
--
-- Lock order: the partition rows are locked in name order before anything
-- else, so two brokers' calls over overlapping partitions queue instead of
-- deadlocking.
CREATE FUNCTION queen.push_segments_v1(
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
DECLARE
    v_n        integer := cardinality(p_partitions);
    v_qid      bigint;
    v_window   integer;
    v_found    integer;
    v_pid      bigint[];
    v_base     bigint[];
    v_at       timestamptz[];
    v_dup_segs integer[] := '{}';
BEGIN
    IF v_n IS NULL OR v_n = 0 OR cardinality(p_counts) <> v_n OR cardinality(p_blobs) <> v_n
       OR cardinality(p_hashes) <> cardinality(p_hash_seg) OR cardinality(p_hashes) <> cardinality(p_hash_pos) THEN
        RAISE EXCEPTION 'push_segments_v1: argument arrays do not line up';
    END IF;
    SELECT q.id, q.dedup_window_seconds INTO v_qid, v_window FROM queen.queues q WHERE q.name = p_queue;
    IF v_qid IS NULL THEN
        v_qid := queen.ensure_queue_v1(p_queue);
        SELECT q.dedup_window_seconds INTO v_window FROM queen.queues q WHERE q.id = v_qid;
    END IF;

    -- Lock (in name order) what exists; create what does not, then lock it.
    SELECT count(*) INTO v_found FROM (
        SELECT 1 FROM queen.partitions p
        WHERE p.queue_id = v_qid AND p.name = ANY (p_partitions)
        ORDER BY p.name FOR UPDATE) l;
    IF v_found < v_n THEN
        INSERT INTO queen.partitions (queue_id, name)
        SELECT v_qid, n FROM unnest(p_partitions) n ORDER BY n
        ON CONFLICT (queue_id, name) DO NOTHING;
        PERFORM 1 FROM queen.partitions p
        WHERE p.queue_id = v_qid AND p.name = ANY (p_partitions)
        ORDER BY p.name FOR UPDATE;
    END IF;

    -- Reserve every segment's offsets (rows already locked: order is moot).
    -- A partition named twice would be updated once: refused below.
    WITH r AS (
        UPDATE queen.partitions p
        SET last_offset = p.last_offset + s.cnt,
            last_write_at = GREATEST(clock_timestamp(), COALESCE(p.last_write_at, '-infinity'))
        FROM unnest(p_partitions, p_counts) WITH ORDINALITY AS s (name, cnt, ord)
        WHERE p.queue_id = v_qid AND p.name = s.name
        RETURNING s.ord, p.id, p.last_offset - s.cnt + 1 AS base, p.last_write_at AS at)
    SELECT array_agg(r.id ORDER BY r.ord), array_agg(r.base ORDER BY r.ord), array_agg(r.at ORDER BY r.ord)
    INTO v_pid, v_base, v_at FROM r;
    IF cardinality(v_pid) <> v_n THEN
        RAISE EXCEPTION 'push_segments_v1: a partition appears twice';
    END IF;

    -- Index entries of every segment; DISTINCT ON keeps the first of equal
    -- hashes inside one segment, as push_segment_v1 does.
    WITH h AS (
        SELECT DISTINCT ON (x.seg, x.hash) x.seg, x.hash, x.pos
        FROM unnest(p_hash_seg, p_hash_pos, p_hashes) AS x (seg, pos, hash)
        ORDER BY x.seg, x.hash, x.pos),
    written AS (
        INSERT INTO queen.txn_index AS t (partition_id, txn_hash, msg_offset, created_at)
        SELECT v_pid[h.seg], h.hash, v_base[h.seg] + h.pos, v_at[h.seg] FROM h
        ON CONFLICT (partition_id, txn_hash) DO UPDATE
            SET msg_offset = EXCLUDED.msg_offset, created_at = EXCLUDED.created_at
            WHERE v_window = 0 OR t.created_at <= EXCLUDED.created_at - make_interval(secs => v_window)
        RETURNING 1)
    SELECT count(*) INTO v_found FROM written;

    IF v_window > 0 AND v_found < cardinality(p_hashes) THEN
        -- The rare path: find the segments holding a frame already in its
        -- partition's window (an index entry outside the segment's own range).
        RETURN QUERY
        SELECT x.seg, v_pid[x.seg], NULL::bigint, NULL::timestamptz, x.pos, t.msg_offset,
               s.base_offset, s.blob, v_window
        FROM unnest(p_hash_seg, p_hash_pos, p_hashes) AS x (seg, pos, hash)
        JOIN queen.txn_index t ON t.partition_id = v_pid[x.seg] AND t.txn_hash = x.hash
        LEFT JOIN LATERAL (
            SELECT s.base_offset, s.blob FROM queen.segments s
            WHERE s.partition_id = v_pid[x.seg] AND s.base_offset <= t.msg_offset
            ORDER BY s.base_offset DESC LIMIT 1
        ) s ON true
        WHERE t.msg_offset NOT BETWEEN v_base[x.seg] AND v_base[x.seg] + p_counts[x.seg] - 1;
        SELECT COALESCE(array_agg(DISTINCT x.seg), '{}') INTO v_dup_segs
        FROM unnest(p_hash_seg, p_hashes) AS x (seg, hash)
        JOIN queen.txn_index t ON t.partition_id = v_pid[x.seg] AND t.txn_hash = x.hash
        WHERE t.msg_offset NOT BETWEEN v_base[x.seg] AND v_base[x.seg] + p_counts[x.seg] - 1;
        IF cardinality(v_dup_segs) > 0 THEN
            DELETE FROM queen.txn_index t
            USING unnest(p_hash_seg, p_hashes) AS x (seg, hash)
            WHERE x.seg = ANY (v_dup_segs)
              AND t.partition_id = v_pid[x.seg] AND t.txn_hash = x.hash
              AND t.msg_offset BETWEEN v_base[x.seg] AND v_base[x.seg] + p_counts[x.seg] - 1;
            UPDATE queen.partitions p SET last_offset = p.last_offset - p_counts[d.seg]
            FROM unnest(v_dup_segs) AS d (seg)
            WHERE p.id = v_pid[d.seg];
        END IF;
    END IF;

    RETURN QUERY
    WITH stored AS (
        INSERT INTO queen.segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
        SELECT v_pid[i], v_base[i], v_base[i] + p_counts[i] - 1, p_counts[i], v_at[i], p_blobs[i]
        FROM generate_subscripts(p_partitions, 1) AS i
        WHERE i <> ALL (v_dup_segs)
        RETURNING 1)
    SELECT i, v_pid[i], v_base[i], v_at[i], NULL::integer, NULL::bigint, NULL::bigint, NULL::bytea, v_window
    FROM generate_subscripts(p_partitions, 1) AS i
    WHERE i <> ALL (v_dup_segs);
END
$$;
