-- maxWaitTimeSeconds where no consumer has read yet (issue 44 §2).
--
-- Eviction works per cursor (0007_encryption_and_eviction.sql), so a
-- partition no group had ever popped kept its overdue messages forever.
-- Upstream evicts a message nobody consumed within the limit whether or
-- not a cursor exists. Such a partition now behaves as one whose
-- queue-mode cursor stands where the queue-mode consumer's subscription
-- would start (queen.seed_cursor_v1's rule: the beginning): the sweep
-- writes that cursor row, and the ordinary eviction then dead-letters the
-- overdue messages for the queue-mode consumer within the same tick. A
-- consumer group that arrives later starts from its own subscription and
-- still sees what was not evicted for it.
--
-- Only partitions without any cursor row are seeded: once a group reads a
-- partition, eviction follows the groups that exist, and a queue read only
-- by named groups gets no queue-mode copies of its dead letters.
-- At most p_limit rows a call; the oldest overdue partitions first is not
-- promised, only that every one is reached within a few ticks.
CREATE FUNCTION queen.eviction_seed_v1(p_limit integer)
RETURNS integer
LANGUAGE sql AS $$
    WITH due AS (
        SELECT p.id AS pid, q.id AS qid
        FROM queen.queues q
        JOIN queen.partitions p ON p.queue_id = q.id
        WHERE q.max_wait_time_seconds > 0
          AND p.last_offset >= 0
          AND NOT EXISTS (SELECT 1 FROM queen.consumers c WHERE c.partition_id = p.id)
          AND EXISTS (SELECT 1 FROM queen.segments s
                      WHERE s.partition_id = p.id
                        AND s.created_at < now() - make_interval(secs => q.max_wait_time_seconds))
        LIMIT p_limit
    ), seeded AS (
        INSERT INTO queen.consumers (partition_id, consumer_group, committed)
        SELECT due.pid, '__QUEUE_MODE__', queen.seed_cursor_v1(due.pid, due.qid, '__QUEUE_MODE__', NULL, NULL) FROM due
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*)::integer FROM seeded
$$;
