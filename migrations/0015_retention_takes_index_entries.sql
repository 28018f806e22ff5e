-- Retention takes the dedup index entries of what it removes.
--
-- retention_v1 deleted segments without a look at the transaction index.
-- Where a segment goes before its queue's dedup window has passed
-- (retentionSeconds or completedRetentionSeconds shorter than
-- dedupWindowSeconds, the default window being an hour), the dedup purge
-- never sees it, so its entries stayed until the partition itself was
-- removed: an index growing with the history of every such partition.
--
-- retention_v2 removes the same segments and keeps log_start and the empty
-- partitions as v1 did, and returns every segment it removed, with its blob
-- when the segment's entries may still be in the index (a windowed queue,
-- at or past the partition's purge mark). The broker decodes those blobs and
-- deletes exactly their entries in the same transaction, as the purge does.
-- A removed message's transactionId is thus forgotten with the message.

CREATE FUNCTION queen.retention_v2(p_batch integer)
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
