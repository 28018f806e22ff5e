-- Background services (src/maintenance/): retention and the cleanup of the
-- partitions it empties. The dedup-window purge and the metrics sampler
-- write their tables (0001_schema.sql) with plain statements from the
-- broker.
--
-- Invariants: retention removes whole segments only, moves log_start to the
-- first remaining offset so a cursor left in the gap scans forward, and
-- never removes a segment some cursor still needs under
-- completedRetentionSeconds.

-- Deletes up to p_batch expired segments: for queues with retentionSeconds,
-- segments older than it; for queues with completedRetentionSeconds,
-- segments older than that which every cursor of the partition has passed
-- and every group subscribed to the queue has a cursor on. log_start of every
-- touched partition moves to its first remaining offset, so a cursor left in
-- the gap scans forward, and a partition left with no segment is noted in
-- queen.empty_partitions.
--
-- Returns every segment it removed, with its blob when the segment's dedup
-- index entries may still be there (a windowed queue, at or past the
-- partition's purge mark): the broker decodes those blobs and deletes
-- exactly their entries in the same transaction, as the dedup purge does. A
-- removed message's transactionId is thus forgotten with the message, even
-- when retention is shorter than the queue's dedup window.
CREATE FUNCTION queen.retention_v1(p_batch integer)
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
        RETURNING s.partition_id, s.base_offset, s.end_offset, CASE WHEN d.unpurged THEN s.blob END AS blob
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

-- Removes up to p_batch partitions that retention emptied and that nobody
-- has written to for p_idle: the partition row, its cursors (the trigger) and
-- its index entries. A candidate written to again is just forgotten.
CREATE FUNCTION queen.cleanup_partitions_v1(p_idle interval, p_batch integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM queen.empty_partitions e
    USING queen.partitions p
    WHERE p.id = e.partition_id AND p.last_offset >= p.log_start;
    DELETE FROM queen.empty_partitions e
    WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = e.partition_id);
    WITH doomed AS (
        SELECT p.id FROM queen.empty_partitions e
        JOIN queen.partitions p ON p.id = e.partition_id
        WHERE p.last_write_at < now() - p_idle
        ORDER BY e.emptied_at
        LIMIT p_batch
        FOR UPDATE OF p SKIP LOCKED
    ), idx AS (
        DELETE FROM queen.txn_index t USING doomed d WHERE t.partition_id = d.id RETURNING 1
    ), gone AS (
        DELETE FROM queen.partitions p USING doomed d WHERE p.id = d.id RETURNING p.id
    ), forgotten AS (
        DELETE FROM queen.empty_partitions e USING gone g WHERE e.partition_id = g.id RETURNING 1
    )
    SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END
$$;
