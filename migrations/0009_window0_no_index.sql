-- Queues without a dedup window keep no transaction index.
--
-- The index upsert was two thirds of PostgreSQL's cost of a 100-message
-- push (pgbench: 1,844 push_segment_v1 calls/s with it, 5,722 without; the
-- index is the only per-message row and its hash keys land on random pages).
-- A queue with dedupWindowSeconds 0 never deduplicates, so the index only
-- served its acks; those now resolve through the broker's registry and, on a
-- miss, by decoding the segments around the group's cursor (ack_span_v1).
--
-- push_segment_v2 / push_segments_v2 are the v1 functions with the index
-- step skipped when the queue's window is 0; everything else (offsets, locks,
-- the duplicate path, the rows returned) is unchanged. The v1 functions stay
-- for brokers of the previous version during a rolling upgrade (what they
-- write for a window-0 queue is still found: acks try the index first).

-- push_segment_v1 (0002_push.sql) with the index step skipped for window 0.
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
    v_qid      bigint;
    v_window   integer;
    v_pid      bigint;
    v_count    integer := cardinality(p_hashes);
    v_base     bigint;
    v_at       timestamptz;
    v_written  integer;
BEGIN
    IF v_count IS NULL OR v_count = 0 THEN
        RAISE EXCEPTION 'push_segment_v2: empty segment';
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
    IF v_window = 0 THEN
        v_written := v_count; -- no window, no index entries
    ELSE
        WITH written AS (
            INSERT INTO queen.txn_index AS t (partition_id, txn_hash, msg_offset, created_at)
            SELECT DISTINCT ON (h.hash) v_pid, h.hash, v_base + h.ord - 1, v_at
            FROM unnest(p_hashes) WITH ORDINALITY AS h (hash, ord)
            ORDER BY h.hash, h.ord
            ON CONFLICT (partition_id, txn_hash) DO UPDATE
                SET msg_offset = EXCLUDED.msg_offset, created_at = EXCLUDED.created_at
                WHERE t.created_at <= EXCLUDED.created_at - make_interval(secs => v_window)
            RETURNING 1)
        SELECT count(*) INTO v_written FROM written;
    END IF;

    IF v_written < v_count THEN
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

-- push_segments_v1 (0007_push_group.sql) with the index step skipped for
-- window 0.
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
        RAISE EXCEPTION 'push_segments_v2: argument arrays do not line up';
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
        RAISE EXCEPTION 'push_segments_v2: a partition appears twice';
    END IF;

    -- Index entries of every segment; DISTINCT ON keeps the first of equal
    -- hashes inside one segment, as push_segment_v2 does.
    IF v_window = 0 THEN
        v_found := cardinality(p_hashes); -- no window, no index entries
    ELSE
        WITH h AS (
            SELECT DISTINCT ON (x.seg, x.hash) x.seg, x.hash, x.pos
            FROM unnest(p_hash_seg, p_hash_pos, p_hashes) AS x (seg, pos, hash)
            ORDER BY x.seg, x.hash, x.pos),
        written AS (
            INSERT INTO queen.txn_index AS t (partition_id, txn_hash, msg_offset, created_at)
            SELECT v_pid[h.seg], h.hash, v_base[h.seg] + h.pos, v_at[h.seg] FROM h
            ON CONFLICT (partition_id, txn_hash) DO UPDATE
                SET msg_offset = EXCLUDED.msg_offset, created_at = EXCLUDED.created_at
                WHERE t.created_at <= EXCLUDED.created_at - make_interval(secs => v_window)
            RETURNING 1)
        SELECT count(*) INTO v_found FROM written;
    END IF;

    IF v_found < cardinality(p_hashes) THEN
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
