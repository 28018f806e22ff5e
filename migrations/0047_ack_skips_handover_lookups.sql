-- An ack without a waiting pop no longer looks up the partition, its queue
-- and its segment (issue 51).
--
-- queen.ack_completed_many_v2 (0028_ack_handover.sql) joins each entry to
-- what a handover needs: the partition's name, its queue's rules, the
-- segment after the acked span. Only an entry with a next lease (a pop of
-- the group parked on this broker) uses them, and the lateral subquery says
-- so (`g.nlease IS NOT NULL`). But the planner pulled that test up into the
-- join's filter, which runs after the inner side: every entry paid three
-- index probes whose rows were then thrown away. auto_explain, 20 entries
-- none of them with a next lease: 280 buffer hits, 160 of them in those
-- probes. At 100,000 partitions of 5 messages a bulk ack carries about 20
-- entries per pop, one per partition, against one at 10 partitions.
--
-- `OFFSET 0` keeps the subquery whole, so the test stays inside it as a
-- gate evaluated per entry before any probe (a Result node's one-time
-- filter, re-checked for each outer row); an entry without a next lease
-- now costs only its cursor row's probe and update. Nothing else changes:
-- same arguments, same rows, same rules. A broker of the previous version
-- calls the same function and gets the same answers.

CREATE OR REPLACE FUNCTION queen.ack_completed_many_v2(
    p_group        text,
    p_pids         bigint[],
    p_leases       text[],
    p_low          bigint[],
    p_high         bigint[],
    p_queues       text[],
    p_next_leases  text[],
    p_next_seconds integer[],
    p_next_batch   integer[],
    p_cached_base  bigint[])
RETURNS TABLE (o_ord integer, o_released boolean, o_queue text,
               o_next_first bigint, o_next_last bigint, o_partition text,
               o_base_offset bigint, o_msg_count integer, o_created_at timestamptz, o_blob bytea)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    UPDATE queen.consumers c SET
        committed = g.hi,
        total_consumed = c.total_consumed + (g.hi - c.committed),
        last_consumed_at = v_now,
        retry_count = 0,
        worker_id = CASE WHEN g.hi < c.batch_end THEN c.worker_id WHEN n.take > 0 THEN g.nlease END,
        lease_expires_at = CASE WHEN g.hi < c.batch_end THEN c.lease_expires_at
                                WHEN n.take > 0 THEN v_now + make_interval(secs => n.lease) END,
        lease_acquired_at = CASE WHEN g.hi < c.batch_end THEN c.lease_acquired_at WHEN n.take > 0 THEN v_now END,
        batch_end = CASE WHEN g.hi < c.batch_end THEN c.batch_end WHEN n.take > 0 THEN g.hi + n.take END,
        attempt_count = CASE WHEN g.hi < c.batch_end THEN c.attempt_count WHEN n.take > 0 THEN 1 ELSE 0 END,
        attempt_offset = CASE WHEN g.hi < c.batch_end THEN c.attempt_offset WHEN n.take > 0 THEN g.hi + 1 END
    FROM unnest(p_pids, p_leases, p_low, p_high, p_queues, p_next_leases, p_next_seconds, p_next_batch, p_cached_base)
             WITH ORDINALITY AS g (pid, lease, lo, hi, queue, nlease, nsecs, nbatch, cached, ord)
    LEFT JOIN LATERAL (
        SELECT p.name AS pname, q.name AS qname, s.base_offset, s.msg_count, s.created_at, s.blob,
               LEAST(GREATEST(g.nbatch, 1), s.end_offset - g.hi)::integer AS take,
               COALESCE(NULLIF(GREATEST(g.nsecs, 0), 0), q.lease_time, 60) AS lease
        FROM queen.partitions p
        JOIN queen.queues q ON q.id = p.queue_id
        JOIN LATERAL (SELECT h.base_offset, h.end_offset, h.msg_count, h.created_at, h.blob
                      FROM queen.segments h
                      WHERE h.partition_id = p.id AND h.base_offset <= g.hi + 1
                      ORDER BY h.base_offset DESC LIMIT 1) s ON s.end_offset > g.hi
        WHERE g.nlease IS NOT NULL AND p.id = g.pid
          AND q.window_buffer = 0 AND q.delayed_processing = 0
        OFFSET 0  -- keeps the gate above the lookups: see the header
    ) n ON true
    WHERE c.partition_id = g.pid AND c.consumer_group = p_group
      AND c.worker_id = g.lease AND c.lease_expires_at > v_now
      AND g.lo > c.committed AND g.hi <= c.batch_end
    RETURNING g.ord::integer,
              c.worker_id IS NULL OR c.worker_id IS DISTINCT FROM g.lease,
              COALESCE(g.queue, n.qname, (SELECT q.name FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                                          WHERE p.id = g.pid)),
              CASE WHEN c.worker_id = g.nlease THEN g.hi + 1 END,
              CASE WHEN c.worker_id = g.nlease THEN c.batch_end END,
              CASE WHEN c.worker_id = g.nlease THEN n.pname END,
              CASE WHEN c.worker_id = g.nlease THEN n.base_offset END,
              CASE WHEN c.worker_id = g.nlease THEN n.msg_count END,
              CASE WHEN c.worker_id = g.nlease THEN n.created_at END,
              CASE WHEN c.worker_id = g.nlease AND n.base_offset IS DISTINCT FROM g.cached THEN n.blob END;
END
$$;

ALTER FUNCTION queen.ack_completed_many_v2(text, bigint[], text[], bigint[], bigint[], text[], text[], integer[], integer[], bigint[])
    SET plan_cache_mode = force_generic_plan;
