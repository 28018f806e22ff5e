-- One statement for a group write the broker's dedup memory covers (issue 46).
--
-- queen.push_segments_of_queues_v1 (0034) finds each segment's queue and
-- partition by name, locks, moves the offsets, checks what the broker's
-- dedup memory does not cover and inserts: five statements and a loop, and
-- at batch 1 most of PostgreSQL's time per call went to starting those
-- statements' executors, not to running them (docs/PERFORMANCE.md). A
-- group of nine one-message segments cost 0.37 ms of PostgreSQL's time
-- through it, and 0.21 ms as this single statement (pgbench, one client,
-- asynchronous commit, the round trip taken out).
--
-- Most segments need none of its lookups: the broker already knows the
-- partition's id, its last offset and the window its memory keeps, because
-- it wrote the partition's previous segment. For such segments the write is
-- one statement: lock each partition (by id, in the order given), and write
-- a segment where the partition is still what the memory says -- its last
-- offset is the one the memory covers and the queue's window is no wider
-- than the memory keeps -- or the queue keeps no window. A segment whose
-- partition moved on (another broker wrote it, a failover lost writes), is
-- gone, or whose queue's window widened is passed over: no row comes back
-- for it, nothing of it is written, and the broker sends it through
-- push_segments_of_queues_v1, which checks what the memory cannot.
--
-- Lock order: the broker gives segments sorted by (queue name, partition
-- name) in byte order, the order push_segments_of_queues_v1 locks in, and
-- each partition is locked by a sub-select per segment in that order
-- before anything is updated, whatever join the planner picks after.
--
-- Arguments, parallel to the segment list:
--   p_pids[s]     the partition id the memory is of
--   p_known[s]    the last offset the memory covers
--   p_windows[s]  the window (seconds) the memory keeps
--   p_counts[s]   number of frames
--   p_blobs[s]    the zstd blob
--   p_firsts[s]   where segment s's hashes start in p_hashes (1-based)
-- and p_hashes: every segment's frame hashes back to back, p_counts[s] each.
-- Rows out, one per segment written: its ordinal in this call, partition,
-- the queue's window, base offset, created_at and the partition's log start
-- (what push_segments_of_queues_v1's row for a written segment says).

CREATE FUNCTION queen.push_known_segments_v1(
    p_pids     bigint[],
    p_known    bigint[],
    p_windows  integer[],
    p_counts   integer[],
    p_blobs    bytea[],
    p_firsts   integer[],
    p_hashes   bigint[])
RETURNS TABLE (
    o_seg           integer,
    o_partition_id  bigint,
    o_window        integer,
    o_base_offset   bigint,
    o_created_at    timestamptz,
    o_log_start     bigint)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH locked AS (
        SELECT s.ord, s.cnt, s.blob, s.first, x.id, x.win
        FROM unnest(p_pids, p_known, p_windows, p_counts, p_blobs, p_firsts)
             WITH ORDINALITY AS s (pid, known, kwin, cnt, blob, first, ord)
        CROSS JOIN LATERAL (
            SELECT p.id, q.dedup_window_seconds AS win
            FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
            WHERE p.id = s.pid
              AND (q.dedup_window_seconds = 0 OR (p.last_offset = s.known AND q.dedup_window_seconds <= s.kwin))
            FOR UPDATE OF p) x
        ORDER BY s.ord
    ), moved AS (
        UPDATE queen.partitions p
        SET last_offset = p.last_offset + l.cnt,
            last_write_at = GREATEST(clock_timestamp(), COALESCE(p.last_write_at, '-infinity'))
        FROM locked l
        WHERE p.id = l.id
        RETURNING l.ord, p.id, l.win, p.last_offset - l.cnt + 1 AS base, l.cnt, p.last_write_at AS at, p.log_start,
                  l.blob, l.first
    ), stored AS (
        INSERT INTO queen.segments (partition_id, base_offset, end_offset, msg_count, created_at, blob, txn_hashes)
        SELECT m.id, m.base, m.base + m.cnt - 1, m.cnt, m.at, m.blob,
               CASE WHEN m.win > 0 THEN p_hashes[m.first:m.first + m.cnt - 1] END
        FROM moved m
    )
    SELECT m.ord::integer, m.id, m.win, m.base, m.at, m.log_start FROM moved m;
END
$$;

ALTER FUNCTION queen.push_known_segments_v1(bigint[], bigint[], integer[], integer[], bytea[], integer[], bigint[])
    SET plan_cache_mode = force_generic_plan;
