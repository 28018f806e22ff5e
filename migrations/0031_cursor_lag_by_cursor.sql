-- queen.cursor_lag names each row's partition by the cursor's own key
-- (issue 51).
--
-- The view's partition_id was the partition's id. The two are equal (the
-- join says so), but PostgreSQL carries a range only on the column it is
-- written on: the gauges' walk asked the view for the cursors of one window
-- of partition ids (src/maintenance/gauges.rs), and the range landed on
-- queen.partitions while every cursor was read to join them (0.9 s a window
-- at 1,000,000 partitions). On c.partition_id, the range reads the cursors'
-- primary key. Equality filters (the dashboard's) read the same either way.
-- Nothing else changes: the same columns, in the same order, with the same
-- values.
CREATE OR REPLACE VIEW queen.cursor_lag AS
SELECT c.consumer_group, q.id AS queue_id, q.name AS queue_name, q.namespace, q.task,
       c.partition_id, p.name AS partition_name, c.committed, c.worker_id,
       c.lease_expires_at > now() AS lease_active, c.last_consumed_at, c.total_consumed,
       GREATEST(p.last_offset - GREATEST(c.committed, p.log_start - 1), 0) AS offset_lag,
       CASE WHEN p.last_offset > c.committed THEN COALESCE(
           (SELECT CASE WHEN h.end_offset > c.committed THEN h.created_at END
            FROM (SELECT s.end_offset, s.created_at FROM queen.segments s
                  WHERE s.partition_id = p.id AND s.base_offset <= c.committed + 1
                  ORDER BY s.base_offset DESC LIMIT 1) h),
           (SELECT s.created_at FROM queen.segments s
            WHERE s.partition_id = p.id AND s.base_offset > c.committed
            ORDER BY s.base_offset LIMIT 1)) END AS oldest_unconsumed_at
FROM queen.consumers c
JOIN queen.partitions p ON p.id = c.partition_id
JOIN queen.queues q ON q.id = p.queue_id;
