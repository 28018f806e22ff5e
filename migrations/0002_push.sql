-- The push path (ARCHITECTURE.md §3): the broker packs a request's
-- messages into zstd segments, one per partition touched, and writes each
-- with one call here. queen.push_segment_v1 writes one segment;
-- queen.push_segments_v1 writes several partitions' segments of one queue in
-- one call (the broker's group commit). Both hand over to a _dedup_ variant
-- when the queue keeps a dedup window, and the broker calls the _dedup_
-- variants directly when it already knows the queue keeps one.
--
-- Invariants: offsets are reserved on the partition row under its lock, so
-- they are gap-free and a partition's writers are serialized; a segment
-- refused as a duplicate keeps nothing and gives its offsets back; created_at
-- = GREATEST(clock_timestamp(), the previous last_write_at), taken under the
-- lock, so it is monotone in base_offset.

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
CREATE FUNCTION queen.push_segment_dedup_v1(
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
        RAISE EXCEPTION 'push_segment_dedup_v1: empty segment';
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

-- Appends one segment of cardinality(p_hashes) frames to (queue, partition)
-- and answers the rows of queen.push_segment_dedup_v1 (above). For a queue
-- without a dedup window (dedupWindowSeconds 0) the transaction index serves
-- no purpose (acks resolve through the broker's registry or by decoding the
-- segments around the cursor, queen.ack_span_v1), so no index entry is
-- written: the offsets reserved, the segment inserted, one success row. That
-- index upsert was two thirds of a 100-message push's cost in PostgreSQL.
-- Anything else (a window, a queue still to create, an empty call) goes to
-- queen.push_segment_dedup_v1.
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
    v_qid    bigint;
    v_count  integer := cardinality(p_hashes);
    v_pid    bigint;
    v_base   bigint;
    v_at     timestamptz;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue AND q.dedup_window_seconds = 0;
    IF v_qid IS NULL OR v_count IS NULL OR v_count = 0 THEN
        -- A window, a queue still to create, or an empty call.
        RETURN QUERY SELECT * FROM queen.push_segment_dedup_v1(p_queue, p_partition, p_hashes, p_blob);
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

-- Group commit: many partitions' segments of one queue in one call.
--
-- queen.push_segment_dedup_v1 costs PostgreSQL about as much CPU per call as
-- four single-row commits, so when a queue's partitions each hold only a
-- message or two (batch-1 producers spread over partitions) the broker is
-- bound by calls, not rows. This function writes the segments the broker has
-- ready for several partitions of one queue with one statement per step
-- instead of one call per segment: reserve every partition's offsets in one
-- UPDATE, upsert every index entry in one INSERT, insert every segment in one
-- INSERT. The semantics per segment are queen.push_segment_dedup_v1's exactly.
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
-- queen.push_segment_dedup_v1; the other segments of the call are written
-- regardless.
--
-- Lock order: the partition rows are locked in name order before anything
-- else, so two brokers' calls over overlapping partitions queue instead of
-- deadlocking.
--
-- It keeps its generic plan: with short arrays PL/pgSQL planned its segment
-- insert on every call (47-76 µs) and came to the generic plan anyway.
CREATE FUNCTION queen.push_segments_dedup_v1(
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
        RAISE EXCEPTION 'push_segments_dedup_v1: argument arrays do not line up';
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
        RAISE EXCEPTION 'push_segments_dedup_v1: a partition appears twice';
    END IF;

    -- Index entries of every segment; DISTINCT ON keeps the first of equal
    -- hashes inside one segment, as push_segment_dedup_v1 does.
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

ALTER FUNCTION queen.push_segments_dedup_v1(text, text[], integer[], bytea[], integer[], integer[], bigint[])
    SET plan_cache_mode = force_generic_plan;

-- queen.push_segments_dedup_v1 (above) for a queue without a dedup window:
-- that function given no hashes, so its index step writes nothing and finds
-- no duplicate.
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
BEGIN
    IF EXISTS (SELECT 1 FROM queen.queues q WHERE q.name = p_queue AND q.dedup_window_seconds = 0) THEN
        RETURN QUERY SELECT * FROM queen.push_segments_dedup_v1(p_queue, p_partitions, p_counts, p_blobs, '{}', '{}', '{}');
    ELSE
        RETURN QUERY SELECT * FROM queen.push_segments_dedup_v1(p_queue, p_partitions, p_counts, p_blobs,
                                                          p_hash_seg, p_hash_pos, p_hashes);
    END IF;
END
$$;
