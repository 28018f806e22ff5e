-- One write for the segments of many queues (issue 51).
--
-- The group commit (src/push/group.rs) writes what many lanes have ready in
-- one transaction, but queen.push_segments_with_memory_v1 takes the segments
-- of one queue, so a group over many queues was one call per queue. With
-- 10,000 queues every segment was its own call: pg_stat_statements put
-- PostgreSQL's time at 4.2 µs a message against 2.0 when the same pushes
-- went to one queue and shared calls, and the push rate at 0.75 of one
-- queue's.
--
-- queen.push_segments_of_queues_v1 is that function with a queue per
-- segment: the same arguments and rows, p_queues[s] naming segment s's
-- queue. Queues are read (and created) together, each by one index probe;
-- each queue's dedup window applies to its own segments.
--
-- Lock order: partitions by (queue name, partition name), both in byte
-- order (COLLATE "C"), which is the order the broker sorts single calls in
-- (Rust compares strings by their bytes). 0029's function ordered names
-- by the database's collation; it is now a wrapper around this one, so
-- every write of this schema takes locks in one order.
--
-- Arguments, parallel to the segment list (1-based ordinals):
--   p_queues[s]      queue name
--   p_partitions[s]  partition name ((queue, partition) distinct)
--   p_counts[s]      number of frames
--   p_blobs[s]       the zstd blob
--   p_known_pid[s]   the partition id the broker's memory is of (NULL: none)
--   p_known[s]       the last offset that memory covers (NULL: none)
--   p_known_window[s] the window (seconds) that memory keeps
-- and p_hashes: every segment's frame hashes back to back, p_counts[s] each.
-- Rows out: 0019_dedup_in_segments.sql describes them; o_seg is the
-- segment's ordinal in this call.

CREATE FUNCTION queen.push_segments_of_queues_v1(
    p_queues      text[],
    p_partitions  text[],
    p_counts      integer[],
    p_blobs       bytea[],
    p_hashes      bigint[],
    p_known_pid   bigint[],
    p_known       bigint[],
    p_known_window integer[])
RETURNS TABLE (
    o_seg           integer,
    o_partition_id  bigint,
    o_window        integer,
    o_prev          bigint,
    o_log_start     bigint,
    o_base_offset   bigint,
    o_created_at    timestamptz,
    o_dup_index     integer,
    o_dup_offset    bigint,
    o_seg_base      bigint,
    o_seg_blob      bytea,
    o_seen_base     bigint,
    o_seen_at       timestamptz,
    o_seen_hashes   bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_n        integer := cardinality(p_partitions);
    v_qids     bigint[];
    v_win      integer[];
    v_found    integer;
    v_ids      bigint[];
    v_pid      bigint[];
    v_base     bigint[];
    v_at       timestamptz[];
    v_log      bigint[];
    v_start    integer[] := '{1}';
    v_dup_segs integer[] := '{}';
    v_cold     boolean;
    v_lo       bigint;
    v_edge     bigint;
    v_since    timestamptz;
BEGIN
    IF v_n IS NULL OR v_n = 0 OR cardinality(p_queues) <> v_n OR cardinality(p_counts) <> v_n
       OR cardinality(p_blobs) <> v_n OR cardinality(p_known_pid) <> v_n OR cardinality(p_known) <> v_n
       OR cardinality(p_known_window) <> v_n THEN
        RAISE EXCEPTION 'push_segments_of_queues_v1: argument arrays do not line up';
    END IF;
    FOR s IN 1..v_n LOOP
        IF p_counts[s] IS NULL OR p_counts[s] < 1 THEN
            RAISE EXCEPTION 'push_segments_of_queues_v1: segment % is empty', s;
        END IF;
        v_start := v_start || (v_start[s] + p_counts[s]);
    END LOOP;
    IF v_start[v_n + 1] - 1 <> COALESCE(cardinality(p_hashes), 0) THEN
        RAISE EXCEPTION 'push_segments_of_queues_v1: % hashes for % frames', cardinality(p_hashes), v_start[v_n + 1] - 1;
    END IF;

    -- Each segment's queue and window. The LIMIT keeps the subquery a
    -- probe of the name index per segment in any plan (a subquery with a
    -- LIMIT is not pulled up into a join the planner could hash).
    FOR attempt IN 1..2 LOOP
        SELECT array_agg(q.id ORDER BY u.ord), array_agg(q.dedup_window_seconds ORDER BY u.ord)
        INTO v_qids, v_win
        FROM unnest(p_queues) WITH ORDINALITY AS u (name, ord)
        LEFT JOIN LATERAL (
            SELECT q.id, q.dedup_window_seconds FROM queen.queues q WHERE q.name = u.name LIMIT 1) q ON true;
        EXIT WHEN array_position(v_qids, NULL) IS NULL OR attempt = 2;
        PERFORM queen.ensure_queue_v1(m.name)
        FROM (SELECT DISTINCT u.name FROM unnest(p_queues, v_qids) AS u (name, id) WHERE u.id IS NULL) m
        ORDER BY m.name COLLATE "C";
    END LOOP;

    -- Lock (in order) what exists; create what does not, then lock it. One
    -- index probe per segment (0029_partition_probe.sql says why): v_ids[s]
    -- is the id of segment s's partition.
    FOR attempt IN 1..2 LOOP
        SELECT count(*), array_agg(l.id ORDER BY u.ord) INTO v_found, v_ids
        FROM (SELECT x.qid, x.n, x.ord FROM unnest(v_qids, p_partitions, p_queues) WITH ORDINALITY AS x (qid, n, q, ord)
              ORDER BY x.q COLLATE "C", x.n COLLATE "C") u
        CROSS JOIN LATERAL (
            SELECT p.id FROM queen.partitions p
            WHERE p.queue_id = u.qid AND p.name = u.n
            FOR UPDATE) l;
        EXIT WHEN v_found >= v_n OR attempt = 2;
        INSERT INTO queen.partitions (queue_id, name)
        SELECT x.qid, x.n FROM unnest(v_qids, p_partitions, p_queues) AS x (qid, n, q)
        ORDER BY x.q COLLATE "C", x.n COLLATE "C"
        ON CONFLICT (queue_id, name) DO NOTHING;
    END LOOP;

    WITH r AS (
        UPDATE queen.partitions p
        SET last_offset = p.last_offset + s.cnt,
            last_write_at = GREATEST(clock_timestamp(), COALESCE(p.last_write_at, '-infinity'))
        FROM unnest(v_ids, p_counts) WITH ORDINALITY AS s (id, cnt, ord)
        WHERE p.id = s.id
        RETURNING s.ord, p.id, p.last_offset - s.cnt + 1 AS base, p.last_write_at AS at, p.log_start)
    SELECT array_agg(r.id ORDER BY r.ord), array_agg(r.base ORDER BY r.ord), array_agg(r.at ORDER BY r.ord),
           array_agg(r.log_start ORDER BY r.ord)
    INTO v_pid, v_base, v_at, v_log FROM r;
    IF cardinality(v_pid) <> v_n THEN
        RAISE EXCEPTION 'push_segments_of_queues_v1: a partition appears twice';
    END IF;

    FOR s IN 1..v_n LOOP
        CONTINUE WHEN v_win[s] = 0;
        -- The broker's memory covers everything before this segment.
        CONTINUE WHEN p_known_pid[s] = v_pid[s] AND p_known[s] = v_base[s] - 1 AND p_known_window[s] >= v_win[s];
        -- A memory past the partition's tail knows writes this database
        -- never got (a failover lost them): it is checked as unknown.
        v_cold := p_known_pid[s] IS DISTINCT FROM v_pid[s] OR p_known[s] IS NULL OR p_known[s] >= v_base[s]
                  OR p_known_window[s] IS NULL OR p_known_window[s] < v_win[s];
        v_lo := CASE WHEN v_cold THEN -1 ELSE p_known[s] END;
        v_since := v_at[s] - make_interval(secs => v_win[s]);
        -- created_at is monotone in base_offset, so the newest segment
        -- already outside the window bounds the ones inside it; walking
        -- the primary key down from the tail stops there.
        SELECT sg.base_offset INTO v_edge FROM queen.segments sg
        WHERE sg.partition_id = v_pid[s] AND sg.base_offset > v_lo AND sg.base_offset < v_base[s]
          AND sg.created_at <= v_since
        ORDER BY sg.base_offset DESC LIMIT 1;
        v_lo := GREATEST(v_lo, v_edge);

        RETURN QUERY
        SELECT s, v_pid[s], v_win[s], v_base[s] - 1, v_log[s], NULL::bigint, NULL::timestamptz,
               NULL::integer, NULL::bigint, NULL::bigint, NULL::bytea, sg.base_offset, sg.created_at, sg.txn_hashes
        FROM queen.segments sg
        WHERE sg.partition_id = v_pid[s] AND sg.base_offset > v_lo AND sg.base_offset < v_base[s]
          AND sg.txn_hashes IS NOT NULL
        UNION ALL
        SELECT s, v_pid[s], v_win[s], v_base[s] - 1, v_log[s], NULL::bigint, NULL::timestamptz,
               NULL::integer, NULL::bigint, NULL::bigint, NULL::bytea, t.msg_offset, t.created_at, ARRAY[t.txn_hash]
        FROM queen.txn_index t
        WHERE v_cold AND t.partition_id = v_pid[s] AND t.created_at > v_since;

        RETURN QUERY
        WITH x AS (
            SELECT u.hash, u.pos FROM unnest(p_hashes[v_start[s]:v_start[s + 1] - 1]) WITH ORDINALITY AS u (hash, pos)
        ), hits AS (
            SELECT x.pos, sg.base_offset + w.ord - 1 AS off
            FROM queen.segments sg
            CROSS JOIN LATERAL unnest(sg.txn_hashes) WITH ORDINALITY AS w (hash, ord)
            JOIN x ON x.hash = w.hash
            WHERE sg.partition_id = v_pid[s] AND sg.base_offset > v_lo AND sg.base_offset < v_base[s]
            UNION ALL
            SELECT x.pos, t.msg_offset
            FROM x JOIN queen.txn_index t ON t.partition_id = v_pid[s] AND t.txn_hash = x.hash
            WHERE v_cold AND t.created_at > v_since
        ), firsts AS (
            SELECT DISTINCT ON (h.pos) h.pos, h.off FROM hits h ORDER BY h.pos, h.off DESC
        )
        SELECT s, v_pid[s], v_win[s], v_base[s] - 1, v_log[s], NULL::bigint, NULL::timestamptz,
               (f.pos - 1)::integer, f.off, sg.base_offset, sg.blob, NULL::bigint, NULL::timestamptz, NULL::bigint[]
        FROM firsts f
        LEFT JOIN LATERAL (
            SELECT sg.base_offset, sg.blob FROM queen.segments sg
            WHERE sg.partition_id = v_pid[s] AND sg.base_offset <= f.off
            ORDER BY sg.base_offset DESC LIMIT 1
        ) sg ON true;
        IF FOUND THEN
            v_dup_segs := v_dup_segs || s;
        END IF;
    END LOOP;
    IF cardinality(v_dup_segs) > 0 THEN
        -- Nothing of a refused segment is kept: its offsets go back.
        UPDATE queen.partitions p SET last_offset = p.last_offset - p_counts[d.seg]
        FROM unnest(v_dup_segs) AS d (seg)
        WHERE p.id = v_pid[d.seg];
    END IF;

    RETURN QUERY
    WITH stored AS (
        INSERT INTO queen.segments (partition_id, base_offset, end_offset, msg_count, created_at, blob, txn_hashes)
        SELECT v_pid[i], v_base[i], v_base[i] + p_counts[i] - 1, p_counts[i], v_at[i], p_blobs[i],
               CASE WHEN v_win[i] > 0 THEN p_hashes[v_start[i]:v_start[i + 1] - 1] END
        FROM generate_subscripts(p_partitions, 1) AS i
        WHERE i <> ALL (v_dup_segs)
        RETURNING 1)
    SELECT i, v_pid[i], v_win[i], v_base[i] - 1, v_log[i], v_base[i], v_at[i],
           NULL::integer, NULL::bigint, NULL::bigint, NULL::bytea, NULL::bigint, NULL::timestamptz, NULL::bigint[]
    FROM generate_subscripts(p_partitions, 1) AS i
    WHERE i <> ALL (v_dup_segs);
END
$$;

ALTER FUNCTION queen.push_segments_of_queues_v1(text[], text[], integer[], bytea[], bigint[], bigint[], bigint[], integer[])
    SET plan_cache_mode = force_generic_plan;

-- The one-queue function (the previous broker version calls it, and so does
-- push_segment_without_window_v1 when a queue has a window after all):
-- the same write, every segment of one queue.
CREATE OR REPLACE FUNCTION queen.push_segments_with_memory_v1(
    p_queue       text,
    p_partitions  text[],
    p_counts      integer[],
    p_blobs       bytea[],
    p_hashes      bigint[],
    p_known_pid   bigint[],
    p_known       bigint[],
    p_known_window integer[])
RETURNS TABLE (
    o_seg           integer,
    o_partition_id  bigint,
    o_window        integer,
    o_prev          bigint,
    o_log_start     bigint,
    o_base_offset   bigint,
    o_created_at    timestamptz,
    o_dup_index     integer,
    o_dup_offset    bigint,
    o_seg_base      bigint,
    o_seg_blob      bytea,
    o_seen_base     bigint,
    o_seen_at       timestamptz,
    o_seen_hashes   bigint[])
LANGUAGE sql AS $$
    SELECT * FROM queen.push_segments_of_queues_v1(array_fill(p_queue, ARRAY[cardinality(p_partitions)]), p_partitions,
                                                   p_counts, p_blobs, p_hashes, p_known_pid, p_known, p_known_window)
$$;
