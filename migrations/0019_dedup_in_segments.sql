-- Deduplication without a per-message index (issue 34).
--
-- Until now every message of a queue with a dedup window wrote one row of
-- queen.txn_index: a random-key B-tree entry that cost PostgreSQL two thirds
-- of a push (docs/PERFORMANCE.md). Now a segment carries the hashes of its
-- frames' transactionIds itself (txn_hashes[i] is frame i's, offset
-- base_offset + i - 1), written with the segment in the same row, and each
-- broker keeps the window's hashes of the partitions it writes in memory
-- (src/push/dedup.rs). A push names what its broker already knows of the
-- partition: (partition id, last offset covered, the window it keeps). Under
-- the partition lock
-- the function compares that with the partition's last offset:
--
--   * equal (one broker writing, its memory current): nothing to look up,
--     the broker has already checked the batch; the segment is inserted;
--   * behind (another broker or a transaction wrote since): only the
--     segments after what the broker knows are checked and sent back, so it
--     catches up;
--   * unknown (a broker's first write to the partition, a restart, a
--     partition re-created under the same name, a window grown past what the
--     broker kept, a memory ahead of the partition's tail because a failover
--     lost writes): every segment still inside the window is checked and
--     sent back.
--
-- Exactness therefore never rests on the broker's memory alone: what it does
-- not know is checked here, under the same lock that serializes writers.
--
-- queen.txn_index is no longer written. The entries written before this
-- migration are still honoured (the unknown case checks them and sends them
-- back) until the dedup purge has removed them as they leave the window.

ALTER TABLE queen.segments ADD COLUMN txn_hashes bigint[];
-- Random 64-bit values never compress: no attempt, as for the blob.
ALTER TABLE queen.segments ALTER COLUMN txn_hashes SET STORAGE EXTERNAL;

-- Appends segments of one queue, one per partition (1 or more), and answers
-- what the broker's memory needs. The broker writes every segment through it
-- except a lone segment of a queue known to keep no window
-- (queen.push_segment_v1, cheaper for one).
--
-- Arguments, parallel to the segment list (1-based ordinals):
--   p_partitions[s]  partition name (distinct)
--   p_counts[s]      number of frames
--   p_blobs[s]       the zstd blob
--   p_known_pid[s]   the partition id the broker's memory is of (NULL: none)
--   p_known[s]       the last offset that memory covers (NULL: none)
--   p_known_window[s] the window (seconds) that memory keeps: a queue whose
--                    window has grown past it is checked as if unknown
-- and p_hashes: every segment's frame hashes back to back, p_counts[s] each.
--
-- Rows out, each naming its segment (o_seg), partition, the queue's window,
-- o_prev (the partition's last offset before this call: what the broker's
-- memory covers once it has taken the rows) and o_log_start:
--   * seen: o_seen_base / o_seen_at / o_seen_hashes, a stored segment inside
--     the window the broker did not know (a pre-0019 index entry comes as a
--     one-hash segment);
--   * written: o_base_offset and o_created_at;
--   * duplicate: o_dup_index (0-based in its segment), o_dup_offset, and the
--     segment holding it (o_seg_base, o_seg_blob) for the original's id. A
--     segment with a duplicate keeps nothing and gives its offsets back; the
--     other segments are written regardless.
-- A queue without a window answers written rows only, and its segments keep
-- no hashes.
--
-- Lock order: partitions in name order, as queen.push_segments_dedup_v1.
CREATE FUNCTION queen.push_segments_v2(
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
        RAISE EXCEPTION 'push_segments_v2: argument arrays do not line up';
    END IF;
    FOR s IN 1..v_n LOOP
        IF p_counts[s] IS NULL OR p_counts[s] < 1 THEN
            RAISE EXCEPTION 'push_segments_v2: segment % is empty', s;
        END IF;
        v_start := v_start || (v_start[s] + p_counts[s]);
    END LOOP;
    IF v_start[v_n + 1] - 1 <> COALESCE(cardinality(p_hashes), 0) THEN
        RAISE EXCEPTION 'push_segments_v2: % hashes for % frames', cardinality(p_hashes), v_start[v_n + 1] - 1;
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
        RAISE EXCEPTION 'push_segments_v2: a partition appears twice';
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

ALTER FUNCTION queen.push_segments_v2(text, text[], integer[], bytea[], bigint[], bigint[], bigint[], integer[])
    SET plan_cache_mode = force_generic_plan;

-- The functions a broker of an earlier version calls (a rolling upgrade)
-- now write through queen.push_segments_v2, as a broker that knows nothing
-- of the partition: every segment inside the window is checked, so
-- deduplication stays exact between old and new brokers, at the cost of that
-- check on each of the old brokers' writes. Their answer keeps its shape.
CREATE OR REPLACE FUNCTION queen.push_segment_dedup_v1(
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
BEGIN
    IF cardinality(p_hashes) IS NULL OR cardinality(p_hashes) = 0 THEN
        RAISE EXCEPTION 'push_segment_dedup_v1: empty segment';
    END IF;
    RETURN QUERY
    SELECT r.o_partition_id, r.o_base_offset, r.o_created_at, r.o_dup_index, r.o_dup_offset, r.o_seg_base,
           r.o_seg_blob, r.o_window
    FROM queen.push_segments_v2(p_queue, ARRAY[p_partition], ARRAY[cardinality(p_hashes)], ARRAY[p_blob], p_hashes,
                                ARRAY[NULL::bigint], ARRAY[NULL::bigint], ARRAY[NULL::integer]) r
    WHERE r.o_seen_base IS NULL;
END
$$;

CREATE OR REPLACE FUNCTION queen.push_segments_dedup_v1(
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
    v_hashes bigint[];
BEGIN
    -- A queue without a window was given no hashes (push_segments_v1): every
    -- frame then counts as hash 0, which is never looked up.
    IF cardinality(p_hashes) = 0 THEN
        SELECT array_agg(0::bigint) INTO v_hashes FROM unnest(p_counts) c, generate_series(1, c);
    ELSE
        SELECT array_agg(x.hash ORDER BY x.seg, x.pos) INTO v_hashes
        FROM unnest(p_hash_seg, p_hash_pos, p_hashes) AS x (seg, pos, hash);
    END IF;
    RETURN QUERY
    SELECT r.o_seg, r.o_partition_id, r.o_base_offset, r.o_created_at, r.o_dup_index, r.o_dup_offset,
           r.o_seg_base, r.o_seg_blob, r.o_window
    FROM queen.push_segments_v2(p_queue, p_partitions, p_counts, p_blobs, v_hashes,
                                array_fill(NULL::bigint, ARRAY[cardinality(p_partitions)]),
                                array_fill(NULL::bigint, ARRAY[cardinality(p_partitions)]),
                                array_fill(NULL::integer, ARRAY[cardinality(p_partitions)])) r
    WHERE r.o_seen_base IS NULL;
END
$$;

-- Retention as in 0006_maintenance.sql, except that a segment carrying its
-- hashes has no index entries to delete, so its blob is not sent back for
-- the broker to decode.
CREATE OR REPLACE FUNCTION queen.retention_v1(p_batch integer)
RETURNS TABLE (o_partition_id bigint, o_base_offset bigint, o_end_offset bigint, o_blob bytea)
LANGUAGE plpgsql AS $$
DECLARE
    v_min_age integer;
BEGIN
    -- The shortest age any queue keeps: a constant bound, so the walk is a
    -- range scan of segments_created_at over old segments only.
    SELECT min(LEAST(NULLIF(q.retention_seconds, 0), NULLIF(q.completed_retention_seconds, 0)))
    INTO v_min_age FROM queen.queues q
    WHERE q.retention_seconds > 0 OR q.completed_retention_seconds > 0;
    IF v_min_age IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH doomed AS (
        SELECT s.partition_id, s.base_offset,
               q.dedup_window_seconds > 0 AND s.base_offset >= COALESCE(m.purged_below, 0) AS unpurged
        FROM queen.segments s
        JOIN queen.partitions p ON p.id = s.partition_id
        JOIN queen.queues q ON q.id = p.queue_id
        LEFT JOIN queen.dedup_purge_marks m ON m.partition_id = s.partition_id
        WHERE s.created_at < now() - make_interval(secs => v_min_age)
          AND (
            (q.retention_seconds > 0 AND s.created_at < now() - make_interval(secs => q.retention_seconds))
            OR (q.completed_retention_seconds > 0
                AND s.created_at < now() - make_interval(secs => q.completed_retention_seconds)
                AND EXISTS (SELECT 1 FROM queen.consumers c WHERE c.partition_id = s.partition_id)
                AND NOT EXISTS (SELECT 1 FROM queen.consumers c
                                WHERE c.partition_id = s.partition_id AND c.committed < s.end_offset)
                AND NOT EXISTS (SELECT 1 FROM queen.subscriptions sub
                                WHERE sub.queue_id = q.id AND NOT EXISTS (
                                    SELECT 1 FROM queen.consumers c
                                    WHERE c.partition_id = s.partition_id AND c.consumer_group = sub.consumer_group))))
        ORDER BY s.created_at
        LIMIT p_batch
    ), deleted AS (
        DELETE FROM queen.segments s USING doomed d
        WHERE s.partition_id = d.partition_id AND s.base_offset = d.base_offset
        RETURNING s.partition_id, s.base_offset, s.end_offset, CASE WHEN d.unpurged AND s.txn_hashes IS NULL THEN s.blob END AS blob
    ), touched AS (
        UPDATE queen.partitions p
        SET log_start = COALESCE((SELECT min(s.base_offset) FROM queen.segments s WHERE s.partition_id = p.id
                                  AND NOT EXISTS (SELECT 1 FROM doomed d WHERE d.partition_id = s.partition_id
                                                  AND d.base_offset = s.base_offset)),
                                 p.last_offset + 1)
        WHERE p.id IN (SELECT DISTINCT partition_id FROM deleted)
        RETURNING p.id, p.log_start > p.last_offset AS empty
    ), noted AS (
        INSERT INTO queen.empty_partitions (partition_id)
        SELECT id FROM touched WHERE empty
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT d.partition_id, d.base_offset, d.end_offset, d.blob FROM deleted d;
END
$$;

