-- The common ack of a multi-partition batch in one statement.
--
-- ack_v1 costs PostgreSQL ~70 µs per (partition, lease) group (measured with
-- track_functions during a 60,000-partition drain: 58,050 calls), which at
-- ten messages per partition is most of the commit path. Nearly every group
-- of such a batch is the plain case: every item completed, the group's
-- lease live, every offset inside the leased span (committed, batch_end].
-- ack_v1's rules for exactly that case: the cursor moves to the highest
-- offset, the retry counter resets, and reaching batch_end releases the lease
-- and resets the attempt counters; every item succeeds.
--
-- This function applies that case to many groups at once and returns the
-- ordinals of the groups it applied (with whether the lease was released and
-- the queue's name). A group it does not return was left untouched and goes
-- through ack_v1, which answers anything else (noops, stale leases, nacks,
-- offsets outside the span) by the full rules.
--
-- Arguments, parallel, one entry per group (partitions distinct is not
-- required; each (partition, lease) is one group): p_pids, p_leases, and the
-- lowest and highest offset the group acknowledges.
CREATE FUNCTION queen.ack_completed_many_v1(
    p_group   text,
    p_pids    bigint[],
    p_leases  text[],
    p_low     bigint[],
    p_high    bigint[])
RETURNS TABLE (o_ord integer, o_released boolean, o_queue text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    -- Cursor rows are locked in partition order, as every multi-partition
    -- writer does, before any of them changes.
    PERFORM 1 FROM queen.consumers c
    WHERE c.partition_id = ANY (p_pids) AND c.consumer_group = p_group
    ORDER BY c.partition_id
    FOR UPDATE OF c;

    RETURN QUERY
    UPDATE queen.consumers c SET
        committed = g.hi,
        total_consumed = c.total_consumed + (g.hi - c.committed),
        last_consumed_at = v_now,
        retry_count = 0,
        worker_id = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.worker_id END,
        lease_expires_at = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.lease_expires_at END,
        lease_acquired_at = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.lease_acquired_at END,
        batch_end = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.batch_end END,
        attempt_count = CASE WHEN g.hi >= c.batch_end THEN 0 ELSE c.attempt_count END,
        attempt_offset = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.attempt_offset END
    FROM unnest(p_pids, p_leases, p_low, p_high) WITH ORDINALITY AS g (pid, lease, lo, hi, ord),
         queen.partitions p, queen.queues q
    WHERE c.partition_id = g.pid AND c.consumer_group = p_group
      AND c.worker_id = g.lease AND c.lease_expires_at > v_now
      AND g.lo > c.committed AND g.hi <= c.batch_end
      AND p.id = g.pid AND q.id = p.queue_id
    RETURNING g.ord::integer, c.worker_id IS NULL, q.name;
END
$$;
