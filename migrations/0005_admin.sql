-- Operating the broker: seeking consumer groups, deleting queues, and the
-- cursor-lag view behind the status and consumer-group routes.

-- Moves a group's cursors on a queue (or one partition of it) and clears
-- their leases, atomically: to each partition's end (p_to_end), or to just
-- before the first segment written at or after p_ts. Partitions the group has
-- no cursor on yet get one at the same place, so the seek holds for them too.
-- Returns how many cursors were placed.
CREATE FUNCTION queen.seek_v1(p_queue text, p_group text, p_to_end boolean, p_ts timestamptz, p_partition text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_qid   bigint;
    v_n     integer;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue;
    IF v_qid IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO queen.consumers AS c (partition_id, consumer_group, committed)
    SELECT p.id, p_group,
           CASE WHEN p_to_end THEN p.last_offset ELSE queen.offset_before_v1(p.id, p_ts) END
    FROM queen.partitions p
    WHERE p.queue_id = v_qid AND (p_partition IS NULL OR p.name = p_partition)
    ON CONFLICT (partition_id, consumer_group) DO UPDATE SET
        committed = EXCLUDED.committed,
        worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL, batch_end = NULL,
        attempt_count = 0, attempt_offset = NULL, retry_count = 0;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    -- A seek is a fresh start for the empty-scan bookkeeping too.
    DELETE FROM queen.scan_watermarks w WHERE w.queue_id = v_qid AND w.consumer_group = p_group;
    RETURN v_n;
END
$$;

-- Deletes a queue and everything under it. The transaction index has no
-- foreign key (one lookup per message would be its price), so its rows go
-- first; the rest cascades from the queue row.
CREATE FUNCTION queen.delete_queue_v1(p_queue text)
RETURNS TABLE (o_existed boolean, o_partitions integer, o_messages bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_qid bigint;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue FOR UPDATE;
    IF v_qid IS NULL THEN
        RETURN QUERY SELECT false, 0, 0::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, count(*)::integer, COALESCE(sum(p.last_offset + 1), 0)::bigint
                 FROM queen.partitions p WHERE p.queue_id = v_qid;
    DELETE FROM queen.txn_index t USING queen.partitions p WHERE p.id = t.partition_id AND p.queue_id = v_qid;
    DELETE FROM queen.queues q WHERE q.id = v_qid;
END
$$;

-- Every cursor with its lag: in messages (from the partition's end and the
-- retention start) and in time (the age of the oldest unconsumed segment,
-- found by the head probe of the claim: one backward step, then the next
-- segment when the cursor sits in a retention gap).
CREATE VIEW queen.cursor_lag AS
SELECT c.consumer_group, q.id AS queue_id, q.name AS queue_name, q.namespace, q.task,
       p.id AS partition_id, p.name AS partition_name, c.committed, c.worker_id,
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
