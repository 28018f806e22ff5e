-- The lease handover (issue 46, src/pop/handover.rs): an ack that ends a
-- lease can lease the partition's next messages, in the same update, to a
-- pop of the same group that is parked on this broker waiting for work.
--
-- Why: a worker loop of `pop batch 1` + one ack per message (the clients'
-- default) with more workers than partitions spent two transactions per
-- message, the ack that released the lease and the claim that took it again
-- (pop_list_v1: about 400 µs of PostgreSQL per call, four statements and a
-- function call), and woke every parked pop of the queue to race for it.
-- Now the ack's row update is also the claim: one statement, in a commit
-- shared with the other acks in flight.
--
-- queen.ack_completed_many_v2 is queen.ack_completed_many_v1 (0004_ack.sql)
-- with four more arrays: p_next_leases (NULL: no waiting pop for that
-- entry), the waiting pop's lease seconds (<= 0: the queue's leaseTime), its
-- batch, and the base offset of a segment the broker holds decompressed
-- (src/pop/frames.rs), whose blob is then not shipped again. An entry with a next lease whose ack ends its lease (the acked
-- span reaches batch_end) is handed over when, and only when, the claim
-- rules would let that pop take the next offset right now:
--   * the queue gates nothing (no windowBuffer, no delayedProcessing);
--   * the segment holding the next offset is there (a gap left by
--     retention goes to the full claim, queen.pop_claim_v1).
-- The new lease covers the next offsets within that segment, at most the
-- pop's batch: (hi, hi + take]. The cursor row is the one the ack locked and
-- fenced (its lease was live, the acked span inside it), so nothing else
-- holds it; attempt telemetry starts as a first delivery would. Every other
-- entry is exactly v1: the lease ends as it did.
--
-- Rows: v1's, plus, for a handed-over entry, the new span, the partition's
-- name and the segment (base offset, frames, created_at, blob: NULL when it
-- is the one the broker holds) for the broker to render. o_released says
-- "the acked lease ended".
CREATE FUNCTION queen.ack_completed_many_v2(
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

-- The way back when the pop a handover was for is gone (its client hung up
-- between parking and the ack's commit): the lease it was given ends now,
-- if it is still that lease, so the messages are claimable at once instead
-- of after the lease time. Nothing was delivered under it.
CREATE FUNCTION queen.lease_return_v1(p_pid bigint, p_group text, p_lease text)
RETURNS boolean
LANGUAGE sql AS $$
    WITH r AS (
        UPDATE queen.consumers c SET
            worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL, batch_end = NULL,
            attempt_count = 0, attempt_offset = NULL
        WHERE c.partition_id = p_pid AND c.consumer_group = p_group AND c.worker_id = p_lease
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM r)
$$;
