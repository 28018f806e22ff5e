-- Names that say what each push function does (issue 44 §5).
--
-- A `_vN` suffix means "the Nth version of one contract", so that a rolling
-- upgrade can keep version N-1 as a wrapper. The push functions had drifted
-- from that: queen.push_segments_v1 was the write of a queue without a dedup
-- window, queen.push_segments_v2 the write that checks duplicates against
-- the broker's dedup memory: two contracts, not two versions of one. The
-- broker now calls:
--
--   queen.push_segments_with_memory_v1   every write but the one below: the
--                                        segments of one queue, one per
--                                        partition, deduplicated against
--                                        what the broker's memory has not
--                                        seen (0019's push_segments_v2,
--                                        renamed; the same contract)
--   queen.push_segment_without_window_v1 a lone segment of a queue known to
--                                        keep no dedup window (0002's
--                                        push_segment_v1, renamed), which
--                                        falls back to the one above when
--                                        the queue has a window after all
--
-- Kept as thin wrappers, because the broker of the previous version calls
-- them during a rolling upgrade: queen.push_segments_v2 and
-- queen.push_segment_v1 (docs/DECISIONS.md lists them). The wrappers of the
-- version before that (push_segment_dedup_v1, push_segments_dedup_v1,
-- push_segments_v1) are dropped: no broker that can run beside this schema
-- calls them.

-- Appends segments of one queue, one per partition (1 or more), and answers
-- what the broker's dedup memory needs; 0019_dedup_in_segments.sql explains
-- the memory and the rows out (there under the name push_segments_v2).
--
-- Arguments, parallel to the segment list (1-based ordinals):
--   p_partitions[s]  partition name (distinct)
--   p_counts[s]      number of frames
--   p_blobs[s]       the zstd blob
--   p_known_pid[s]   the partition id the broker's memory is of (NULL: none)
--   p_known[s]       the last offset that memory covers (NULL: none)
--   p_known_window[s] the window (seconds) that memory keeps
-- and p_hashes: every segment's frame hashes back to back, p_counts[s] each.
--
-- Lock order: partitions in name order, so two brokers' calls over
-- overlapping partitions queue instead of deadlocking.
CREATE FUNCTION queen.push_segments_with_memory_v1(
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
LANGUAGE plpgsql AS $$
DECLARE
    v_n        integer := cardinality(p_partitions);
    v_qid      bigint;
    v_window   integer;
    v_found    integer;
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
    IF v_n IS NULL OR v_n = 0 OR cardinality(p_counts) <> v_n OR cardinality(p_blobs) <> v_n
       OR cardinality(p_known_pid) <> v_n OR cardinality(p_known) <> v_n OR cardinality(p_known_window) <> v_n THEN
        RAISE EXCEPTION 'push_segments_with_memory_v1: argument arrays do not line up';
    END IF;
    FOR s IN 1..v_n LOOP
        IF p_counts[s] IS NULL OR p_counts[s] < 1 THEN
            RAISE EXCEPTION 'push_segments_with_memory_v1: segment % is empty', s;
        END IF;
        v_start := v_start || (v_start[s] + p_counts[s]);
    END LOOP;
    IF v_start[v_n + 1] - 1 <> COALESCE(cardinality(p_hashes), 0) THEN
        RAISE EXCEPTION 'push_segments_with_memory_v1: % hashes for % frames', cardinality(p_hashes), v_start[v_n + 1] - 1;
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

    WITH r AS (
        UPDATE queen.partitions p
        SET last_offset = p.last_offset + s.cnt,
            last_write_at = GREATEST(clock_timestamp(), COALESCE(p.last_write_at, '-infinity'))
        FROM unnest(p_partitions, p_counts) WITH ORDINALITY AS s (name, cnt, ord)
        WHERE p.queue_id = v_qid AND p.name = s.name
        RETURNING s.ord, p.id, p.last_offset - s.cnt + 1 AS base, p.last_write_at AS at, p.log_start)
    SELECT array_agg(r.id ORDER BY r.ord), array_agg(r.base ORDER BY r.ord), array_agg(r.at ORDER BY r.ord),
           array_agg(r.log_start ORDER BY r.ord)
    INTO v_pid, v_base, v_at, v_log FROM r;
    IF cardinality(v_pid) <> v_n THEN
        RAISE EXCEPTION 'push_segments_with_memory_v1: a partition appears twice';
    END IF;

    IF v_window > 0 THEN
        FOR s IN 1..v_n LOOP
            -- The broker's memory covers everything before this segment.
            CONTINUE WHEN p_known_pid[s] = v_pid[s] AND p_known[s] = v_base[s] - 1 AND p_known_window[s] >= v_window;
            -- A memory past the partition's tail knows writes this database
            -- never got (a failover lost them): it is checked as unknown.
            v_cold := p_known_pid[s] IS DISTINCT FROM v_pid[s] OR p_known[s] IS NULL OR p_known[s] >= v_base[s]
                      OR p_known_window[s] IS NULL OR p_known_window[s] < v_window;
            v_lo := CASE WHEN v_cold THEN -1 ELSE p_known[s] END;
            v_since := v_at[s] - make_interval(secs => v_window);
            -- created_at is monotone in base_offset, so the newest segment
            -- already outside the window bounds the ones inside it; walking
            -- the primary key down from the tail stops there.
            SELECT sg.base_offset INTO v_edge FROM queen.segments sg
            WHERE sg.partition_id = v_pid[s] AND sg.base_offset > v_lo AND sg.base_offset < v_base[s]
              AND sg.created_at <= v_since
            ORDER BY sg.base_offset DESC LIMIT 1;
            v_lo := GREATEST(v_lo, v_edge);

            RETURN QUERY
            SELECT s, v_pid[s], v_window, v_base[s] - 1, v_log[s], NULL::bigint, NULL::timestamptz,
                   NULL::integer, NULL::bigint, NULL::bigint, NULL::bytea, sg.base_offset, sg.created_at, sg.txn_hashes
            FROM queen.segments sg
            WHERE sg.partition_id = v_pid[s] AND sg.base_offset > v_lo AND sg.base_offset < v_base[s]
              AND sg.txn_hashes IS NOT NULL
            UNION ALL
            SELECT s, v_pid[s], v_window, v_base[s] - 1, v_log[s], NULL::bigint, NULL::timestamptz,
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
            SELECT s, v_pid[s], v_window, v_base[s] - 1, v_log[s], NULL::bigint, NULL::timestamptz,
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
    END IF;

    RETURN QUERY
    WITH stored AS (
        INSERT INTO queen.segments (partition_id, base_offset, end_offset, msg_count, created_at, blob, txn_hashes)
        SELECT v_pid[i], v_base[i], v_base[i] + p_counts[i] - 1, p_counts[i], v_at[i], p_blobs[i],
               CASE WHEN v_window > 0 THEN p_hashes[v_start[i]:v_start[i + 1] - 1] END
        FROM generate_subscripts(p_partitions, 1) AS i
        WHERE i <> ALL (v_dup_segs)
        RETURNING 1)
    SELECT i, v_pid[i], v_window, v_base[i] - 1, v_log[i], v_base[i], v_at[i],
           NULL::integer, NULL::bigint, NULL::bigint, NULL::bytea, NULL::bigint, NULL::timestamptz, NULL::bigint[]
    FROM generate_subscripts(p_partitions, 1) AS i
    WHERE i <> ALL (v_dup_segs);
END
$$;

ALTER FUNCTION queen.push_segments_with_memory_v1(text, text[], integer[], bytea[], bigint[], bigint[], bigint[], integer[])
    SET plan_cache_mode = force_generic_plan;

-- One segment of a queue without a dedup window: reserve the offsets,
-- insert the segment, keep no hashes. A queue with a window, or one still to
-- create, goes through queen.push_segments_with_memory_v1 as a broker that
-- knows nothing of the partition (every segment in the window is checked).
CREATE FUNCTION queen.push_segment_without_window_v1(
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
    IF v_count IS NULL OR v_count = 0 THEN
        RAISE EXCEPTION 'push_segment_without_window_v1: empty segment';
    END IF;
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue AND q.dedup_window_seconds = 0;
    IF v_qid IS NULL THEN
        RETURN QUERY
        SELECT r.o_partition_id, r.o_base_offset, r.o_created_at, r.o_dup_index, r.o_dup_offset, r.o_seg_base,
               r.o_seg_blob, r.o_window
        FROM queen.push_segments_with_memory_v1(p_queue, ARRAY[p_partition], ARRAY[v_count], ARRAY[p_blob], p_hashes,
                                                ARRAY[NULL::bigint], ARRAY[NULL::bigint], ARRAY[NULL::integer]) r
        WHERE r.o_seen_base IS NULL;
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

-- The previous broker version's two calls, as wrappers.
CREATE OR REPLACE FUNCTION queen.push_segments_v2(
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
    SELECT * FROM queen.push_segments_with_memory_v1(p_queue, p_partitions, p_counts, p_blobs, p_hashes,
                                                     p_known_pid, p_known, p_known_window)
$$;

CREATE OR REPLACE FUNCTION queen.push_segment_v1(
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
LANGUAGE sql AS $$
    SELECT * FROM queen.push_segment_without_window_v1(p_queue, p_partition, p_hashes, p_blob)
$$;

DROP FUNCTION queen.push_segments_v1(text, text[], integer[], bytea[], integer[], integer[], bigint[]);
DROP FUNCTION queen.push_segments_dedup_v1(text, text[], integer[], bytea[], integer[], integer[], bigint[]);
DROP FUNCTION queen.push_segment_dedup_v1(text, text, bigint[], bytea);
