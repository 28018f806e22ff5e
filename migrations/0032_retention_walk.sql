-- A retention pass that costs what it removes (issue 51).
--
-- queen.retention_v1 (0019_dedup_in_segments.sql) takes the oldest due
-- segments, p_batch at a time. Two of its steps grew with the log, not the
-- batch: at 1,000,000 segments one batch of 1,000 took 1.4-1.5 s, so a
-- pass over them would take about 25 minutes.
--
--   * The walk. With the shortest retention short (1 s), "older than the
--     shortest age" is nearly every segment; the planner then joined all
--     segments to all partitions by hash and sorted them to keep the oldest
--     1,000, instead of walking the segments_created_at index and stopping
--     at 1,000. The function now runs with hash and merge joins off, which
--     leaves it the walk (nested loops into the primary keys): it reads what
--     it removes plus the old segments of queues that keep theirs.
--   * The new log_start of each touched partition looked every remaining
--     segment up in the batch's list of doomed ones (a scan of the list per
--     segment: 1,000 x 1,000 per batch). What a partition loses is a prefix,
--     so its new start is its first segment past the last one removed.
--
-- Rows out and every rule are as before.

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
        -- What a partition loses is a prefix (segments are monotone in
        -- created_at and in what their cursors committed), so its new start
        -- is its first segment past the last one removed.
        UPDATE queen.partitions p
        SET log_start = COALESCE((SELECT min(s.base_offset) FROM queen.segments s
                                  WHERE s.partition_id = p.id AND s.base_offset > t.top),
                                 p.last_offset + 1)
        FROM (SELECT partition_id, max(base_offset) AS top FROM deleted GROUP BY partition_id) t
        WHERE p.id = t.partition_id
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

ALTER FUNCTION queen.retention_v1(integer) SET enable_hashjoin = off;
ALTER FUNCTION queen.retention_v1(integer) SET enable_mergejoin = off;
