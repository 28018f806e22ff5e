-- A multi-partition claim in one pass over the cursor rows, and a plain ack
-- batch without its separate lock pass or its per-row queue lookup.
--
-- At 100,000 partitions a pop of 500 spans 50 partitions of 10 messages, and
-- PostgreSQL's work per partition bounds the drain (docs/PERFORMANCE.md,
-- stop 13: ~31 µs per claimed partition, ~9 per acknowledged one). pgbench of
-- the functions on 50 such partitions (stop 14, one client, rolled back):
-- pop_list_v3 1.27 ms, of which its step 1 (an unlocked read of the
-- candidates' cursor, partition and queue rows) 0.35 ms;
-- ack_completed_many_v1 0.47 ms.
--
-- pop_list_v4 is pop_list_v3 with steps 1 and 2 in one statement (1.09 ms):
--
--   * the locking read takes the first LEAST(budget, partition cap)
--     candidates' cursor rows at once (SKIP LOCKED) and the statement checks
--     under the lock what step 1 checked before it (free, a backlog, an
--     ungated queue), reading each row once instead of twice. A pop whose
--     first partition fills its budget still claims only that one, but locks
--     the other rows until its commit; the broker sends such claims to
--     pop_list_v2 (a ring whose last claim came from one partition, see
--     pop::hotlist), so this is the rare first claim of a deep queue;
--   * the update finds its rows by key, as in v3, not by the ctid the lock
--     returned: a row updated and committed after the statement's snapshot
--     is locked in its new version, which a ctid scan under that snapshot
--     cannot see, so the lease would silently not be written (the key's
--     scan finds the old version and follows it to the new one);
--   * the head segment's row, found to check that the next offset is there,
--     is the first segment delivered: the segments after it are read only
--     for a claim that goes past it (one index probe less per partition);
--   * 'busy' is a candidate among those whose row exists but was locked by
--     another transaction; one without a cursor row goes on to step 3
--     (pop_list_v2 seeds it), as before.
--
-- Same arguments and rows as pop_list_v3; its step 3 is this one's step 2.
CREATE FUNCTION queen.pop_list_v4(
    p_pids           bigint[],
    p_group          text,
    p_worker         text,
    p_lease_seconds  integer,
    p_auto_ack       boolean,
    p_budget         integer,
    p_max_partitions integer,
    p_intent_mode    text,
    p_intent_from    timestamptz)
RETURNS SETOF queen.pop_row
LANGUAGE plpgsql AS $$
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_try      bigint[];
    v_settled  bigint[] := '{}';
    v_rest     bigint[];
    v_left     integer := p_budget;
    v_claimed  integer := 0;
    r          queen.pop_row;
BEGIN
    IF COALESCE(cardinality(p_pids), 0) < 2 THEN
        RETURN QUERY SELECT * FROM queen.pop_list_v2(
            p_pids, p_group, p_worker, p_lease_seconds, p_auto_ack, p_budget, p_max_partitions,
            p_intent_mode, p_intent_from);
        RETURN;
    END IF;
    -- Only the first candidates that could all be claimed (each claimed
    -- partition takes at least one message and counts against the cap).
    v_try := p_pids[1:LEAST(p_budget, CASE WHEN p_max_partitions > 0 THEN p_max_partitions ELSE p_budget END)];
    -- 1. Lock, check, plan, lease and read in one statement (one snapshot).
    FOR r IN
        WITH locked AS (
            SELECT c.partition_id AS pid, c.committed, c.worker_id, c.lease_expires_at
            FROM queen.consumers c
            WHERE c.partition_id = ANY (v_try) AND c.consumer_group = p_group
            FOR UPDATE SKIP LOCKED
        ), headed AS (
            SELECT u.pid, u.ord, l.committed + 1 AS first, p.last_offset, p.name AS pname, q.name AS qname,
                   COALESCE(NULLIF(GREATEST(p_lease_seconds, 0), 0), q.lease_time, 60) AS lease,
                   h.base_offset AS head_base, h.end_offset AS head_end, h.created_at AS head_at,
                   h.blob AS head_blob, h.msg_count AS head_count
            FROM unnest(v_try) WITH ORDINALITY AS u (pid, ord)
            JOIN locked l ON l.pid = u.pid
            JOIN queen.partitions p ON p.id = u.pid
            CROSS JOIN LATERAL (SELECT q.name, q.lease_time FROM queen.queues q
                                WHERE q.id = p.queue_id AND q.window_buffer = 0 AND q.delayed_processing = 0
                                OFFSET 0) q
            CROSS JOIN LATERAL (SELECT s.base_offset, s.end_offset, s.created_at, s.blob, s.msg_count
                                FROM queen.segments s
                                WHERE s.partition_id = u.pid AND s.base_offset <= l.committed + 1
                                ORDER BY s.base_offset DESC LIMIT 1) h
            WHERE (l.worker_id IS NULL OR l.lease_expires_at IS NULL OR l.lease_expires_at < v_now)
              AND p.last_offset > l.committed AND h.end_offset > l.committed
        ), plan AS (
            SELECT x.*, LEAST(x.last_offset, x.first + x.budget_here - 1) AS last
            FROM (SELECT h.*, p_budget - COALESCE(sum(h.last_offset - h.first + 1) OVER (
                              ORDER BY h.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::bigint AS budget_here
                  FROM headed h) x
            WHERE x.budget_here > 0
        ), leased AS (
            UPDATE queen.consumers c SET
                committed         = CASE WHEN p_auto_ack THEN pl.last ELSE c.committed END,
                worker_id         = CASE WHEN p_auto_ack THEN NULL ELSE p_worker END,
                lease_expires_at  = CASE WHEN p_auto_ack THEN NULL
                                         ELSE v_now + make_interval(secs => pl.lease) END,
                lease_acquired_at = CASE WHEN p_auto_ack THEN NULL ELSE v_now END,
                batch_end         = CASE WHEN p_auto_ack THEN NULL ELSE pl.last END,
                total_consumed    = CASE WHEN p_auto_ack THEN c.total_consumed + (pl.last - pl.first + 1)
                                         ELSE c.total_consumed END,
                last_consumed_at  = CASE WHEN p_auto_ack THEN v_now ELSE c.last_consumed_at END,
                attempt_count     = CASE WHEN p_auto_ack THEN c.attempt_count
                                         WHEN c.attempt_offset IS NOT DISTINCT FROM pl.first
                                         THEN c.attempt_count + 1 ELSE 1 END,
                attempt_offset    = CASE WHEN p_auto_ack THEN c.attempt_offset ELSE pl.first END
            FROM plan pl
            WHERE c.partition_id = pl.pid AND c.consumer_group = p_group
            RETURNING c.partition_id AS pid, CASE WHEN p_auto_ack THEN 1 ELSE c.attempt_count END AS attempt
        )
        SELECT o.partition_id, o.partition, o.queue, o.kind, o.base_offset, o.start_idx, o.take,
               o.created_at, o.blob, o.first, o.last, o.attempt, o.msg_count
        FROM (
            -- The head segment, read above; the segments after it only where
            -- the claim goes past it (no second probe for a shallow partition).
            SELECT pl.ord, 0 AS rank, pl.pid AS partition_id, pl.pname AS partition, pl.qname AS queue,
                   'segment' AS kind, pl.head_base AS base_offset, (pl.first - pl.head_base)::integer AS start_idx,
                   (LEAST(pl.head_end, pl.last) - pl.first + 1)::integer AS take,
                   pl.head_at AS created_at, pl.head_blob AS blob, NULL::bigint AS first, NULL::bigint AS last,
                   NULL::integer AS attempt, pl.head_count AS msg_count
            FROM plan pl
            UNION ALL
            SELECT pl.ord, 0, pl.pid, pl.pname, pl.qname, 'segment', g.base_offset, 0,
                   (LEAST(g.end_offset, pl.last) - g.base_offset + 1)::integer,
                   g.created_at, g.blob, NULL, NULL, NULL, g.msg_count
            FROM plan pl
            JOIN queen.segments g ON g.partition_id = pl.pid
                 AND g.base_offset > pl.head_base AND g.base_offset <= pl.last
            WHERE pl.last > pl.head_end
            UNION ALL
            SELECT pl.ord, 1, pl.pid, pl.pname, pl.qname, 'claimed', NULL, NULL, NULL, NULL, NULL,
                   pl.first, pl.last, ls.attempt, NULL
            FROM plan pl JOIN leased ls ON ls.pid = pl.pid
            UNION ALL
            -- (The fence keeps the row check to the few not locked: as a
            -- semi-join it probed every candidate, +0.1 ms for 50.)
            SELECT u.ord, 1, u.pid, NULL, NULL, 'busy', NULL, NULL, NULL, NULL, NULL,
                   NULL, NULL, NULL, NULL
            FROM (SELECT v.pid, v.ord FROM unnest(v_try) WITH ORDINALITY AS v (pid, ord)
                  WHERE NOT EXISTS (SELECT 1 FROM locked l WHERE l.pid = v.pid)
                  OFFSET 0) u
            WHERE EXISTS (SELECT 1 FROM queen.consumers c
                          WHERE c.partition_id = u.pid AND c.consumer_group = p_group)
        ) o
        ORDER BY o.ord, o.rank, o.base_offset
    LOOP
        RETURN NEXT r;
        IF r.o_kind <> 'segment' THEN
            v_settled := v_settled || r.o_partition_id;
        END IF;
        IF r.o_kind = 'claimed' THEN
            v_claimed := v_claimed + 1;
            v_left := v_left - (r.o_last - r.o_first + 1)::integer;
        END IF;
    END LOOP;
    -- 2. The rest, in order, through the per-partition path.
    IF v_left <= 0 OR (p_max_partitions > 0 AND v_claimed >= p_max_partitions) THEN
        RETURN;
    END IF;
    SELECT array_agg(u.pid ORDER BY u.ord) INTO v_rest
    FROM unnest(COALESCE(p_pids, '{}')) WITH ORDINALITY AS u (pid, ord)
    WHERE u.pid <> ALL (v_settled);
    IF v_rest IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM queen.pop_list_v2(
        v_rest, p_group, p_worker, p_lease_seconds, p_auto_ack, v_left,
        CASE WHEN p_max_partitions > 0 THEN p_max_partitions - v_claimed ELSE 0 END,
        p_intent_mode, p_intent_from);
END
$$;

-- ack_completed_many_v1's rules, cheaper per group (0.47 → 0.27 ms for 50
-- groups, pgbench, stop 14):
--
--   * no separate lock pass. The update is driven by the arrays in the order
--     given (an index probe per element, the generic plan pinned below), and
--     the broker sends them in partition order, so the cursor rows are still
--     locked in partition order, now by the update itself. Should a plan
--     ever lock in another order, a deadlock aborts one transaction, which
--     the broker retries (ack::DEADLOCK_ATTEMPTS);
--   * the queue's name comes from p_queues, where the broker knows it (the
--     ack registry remembers the queue of each leased batch it handed out);
--     only a NULL entry is looked up, through the partition row.
CREATE FUNCTION queen.ack_completed_many_v2(
    p_group   text,
    p_pids    bigint[],
    p_leases  text[],
    p_low     bigint[],
    p_high    bigint[],
    p_queues  text[])
RETURNS TABLE (o_ord integer, o_released boolean, o_queue text)
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
        worker_id = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.worker_id END,
        lease_expires_at = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.lease_expires_at END,
        lease_acquired_at = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.lease_acquired_at END,
        batch_end = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.batch_end END,
        attempt_count = CASE WHEN g.hi >= c.batch_end THEN 0 ELSE c.attempt_count END,
        attempt_offset = CASE WHEN g.hi >= c.batch_end THEN NULL ELSE c.attempt_offset END
    FROM unnest(p_pids, p_leases, p_low, p_high, p_queues) WITH ORDINALITY AS g (pid, lease, lo, hi, queue, ord)
    WHERE c.partition_id = g.pid AND c.consumer_group = p_group
      AND c.worker_id = g.lease AND c.lease_expires_at > v_now
      AND g.lo > c.committed AND g.hi <= c.batch_end
    RETURNING g.ord::integer, c.worker_id IS NULL,
              COALESCE(g.queue, (SELECT q.name FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
                                 WHERE p.id = g.pid));
END
$$;
-- As ack_completed_many_v1 (migration 0017): planned once, not per call.
ALTER FUNCTION queen.ack_completed_many_v2(text, bigint[], text[], bigint[], bigint[], text[])
    SET plan_cache_mode = force_generic_plan;
