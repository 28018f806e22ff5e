-- A shared claim tries every pop's first candidate in one statement (issue 46).
--
-- queen.pop_list_shared_v2 (0049) ran pop_list_v2 slot by slot: about four
-- statements per pop (read the candidates, lock the cursor, read the head
-- segment, lease), 0.143 ms a slot, where the set-based pop_list_set_v1
-- claims a partition for about 0.036 ms. In the clients' default loop (pop
-- batch 1 + ack, 32 consumers over 100 partitions) a shared claim carried
-- about 13 pops and took 1.3 ms.
--
-- queen.pop_list_shared_v3 takes the same arguments and answers the same
-- rows. It claims in two steps, as pop_list_set_v1 does for one pop:
--
--   1. One statement over every slot's first candidate: lock its cursor row
--      (SKIP LOCKED, unleased rows only), check, plan, lease and read the
--      head segment, each slot with its own group, worker, lease time,
--      autoAck and budget. Only the first candidate: locking a slot's other
--      candidates to claim one of them would hold rows that concurrent pops
--      then see as busy. A first candidate locked elsewhere or leased is
--      answered 'busy' here, as pop_list_v2 answers it.
--   2. Each slot that still has budget (and room under its partition cap)
--      goes on through pop_list_v2 with its remaining candidates: those
--      after a first candidate step 1 settled, or all of them when step 1
--      said nothing of the first (no cursor row yet, a gated queue, nothing
--      past the cursor, no head segment: the cases pop_list_v2 hands to the
--      full claim). Step 1 holds such a row's lock; the same transaction
--      re-reads it without waiting.
--
-- The claim rules do not change: claim-first with SKIP LOCKED, one lease per
-- partition and group. The ring checks out each candidate for one pop, so
-- no two slots of one group share a partition; if they ever did, step 1
-- gives the partition to the first of them only, and the other meets it in
-- step 2, leased by this transaction: 'busy'. A segment the broker holds
-- (p_cached) comes back with a NULL blob and is not read, as in
-- pop_list_v2. pop_list_shared_v2 stays for a broker of the previous version
-- during a rolling upgrade.
CREATE FUNCTION queen.pop_list_shared_v3(
    p_ends           integer[],
    p_pids           bigint[],
    p_cached         bigint[],
    p_groups         text[],
    p_workers        text[],
    p_lease_seconds  integer[],
    p_auto_ack       boolean[],
    p_budgets        integer[],
    p_max_partitions integer[],
    p_intent_modes   text[],
    p_intent_froms   timestamptz[])
RETURNS TABLE (o_slot integer, o_partition_id bigint, o_partition text, o_queue text, o_kind text,
               o_base_offset bigint, o_start_idx integer, o_take integer, o_created_at timestamptz,
               o_blob bytea, o_first bigint, o_last bigint, o_attempt integer, o_msg_count integer)
LANGUAGE plpgsql
-- Step 1's statement is large, and planning it costs about 0.5 ms. With one
-- or two slots the planner's custom plans look cheaper than the generic one,
-- so PL/pgSQL planned it afresh on every call: 1.0 ms for one slot against
-- 0.42 ms with the generic plan, which is the same nested loop of index
-- probes (pgbench, one client, 100,000 partitions: 0.44 ms for 2 slots,
-- 0.51 for 8, 0.67 for 20).
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_slots    integer := COALESCE(cardinality(p_ends), 0);
    v_firsts   bigint[] := '{}';
    v_cfirst   bigint[] := '{}';
    v_settled  boolean[];
    v_used     integer[];
    v_taken    integer[];
    v_from     integer := 1;
    v_skip     integer;
    v_left     integer;
    i          integer;
BEGIN
    IF v_slots = 0 THEN
        RETURN;
    END IF;
    v_settled := array_fill(false, ARRAY[v_slots]);
    v_used := array_fill(0, ARRAY[v_slots]);
    v_taken := array_fill(0, ARRAY[v_slots]);
    FOR i IN 1..v_slots LOOP
        -- NULL for a slot without candidates, or one with nothing to take.
        v_firsts := v_firsts || CASE WHEN p_ends[i] >= v_from AND p_budgets[i] > 0 THEN p_pids[v_from] END;
        v_cfirst := v_cfirst || CASE WHEN p_ends[i] >= v_from THEN p_cached[v_from] END;
        v_from := p_ends[i] + 1;
    END LOOP;
    -- 1. Every slot's first candidate: lock, check, plan, lease and read in
    --    one statement (one snapshot).
    FOR o_slot, o_partition_id, o_partition, o_queue, o_kind, o_base_offset, o_start_idx, o_take, o_created_at,
        o_blob, o_first, o_last, o_attempt, o_msg_count IN
        WITH slot AS (
            SELECT DISTINCT ON (u.pid, u.grp) u.*
            FROM unnest(v_firsts, v_cfirst, p_groups, p_workers, p_lease_seconds, p_auto_ack, p_budgets)
                 WITH ORDINALITY AS u (pid, cached, grp, worker, lease_s, auto_ack, budget, slot)
            WHERE u.pid IS NOT NULL
            ORDER BY u.pid, u.grp, u.slot
        ), locked AS (
            SELECT s.slot, c.committed
            FROM slot s
            JOIN queen.consumers c ON c.partition_id = s.pid AND c.consumer_group = s.grp
            WHERE c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now
            FOR UPDATE OF c SKIP LOCKED
        ), plan AS (
            SELECT s.slot, s.pid, s.grp, s.worker, s.auto_ack, l.committed + 1 AS first,
                   LEAST(p.last_offset, l.committed + s.budget) AS last,
                   p.last_offset, p.name AS pname, q.name AS qname,
                   COALESCE(NULLIF(GREATEST(s.lease_s, 0), 0), q.lease_time, 60) AS lease,
                   h.base_offset AS head_base, h.end_offset AS head_end, h.created_at AS head_at,
                   h.blob AS head_blob, h.msg_count AS head_count
            FROM slot s
            JOIN locked l ON l.slot = s.slot
            JOIN queen.partitions p ON p.id = s.pid
            CROSS JOIN LATERAL (SELECT q.name, q.lease_time FROM queen.queues q
                                WHERE q.id = p.queue_id AND q.window_buffer = 0 AND q.delayed_processing = 0
                                OFFSET 0) q
            CROSS JOIN LATERAL (SELECT g.base_offset, g.end_offset, g.created_at, g.msg_count,
                                       CASE WHEN g.base_offset IS NOT DISTINCT FROM s.cached THEN NULL ELSE g.blob END AS blob
                                FROM queen.segments g
                                WHERE g.partition_id = s.pid AND g.base_offset <= l.committed + 1
                                ORDER BY g.base_offset DESC LIMIT 1) h
            WHERE p.last_offset > l.committed AND h.end_offset > l.committed
        ), leased AS (
            UPDATE queen.consumers c SET
                committed         = CASE WHEN pl.auto_ack THEN pl.last ELSE c.committed END,
                worker_id         = CASE WHEN pl.auto_ack THEN NULL ELSE pl.worker END,
                lease_expires_at  = CASE WHEN pl.auto_ack THEN NULL
                                         ELSE v_now + make_interval(secs => pl.lease) END,
                lease_acquired_at = CASE WHEN pl.auto_ack THEN NULL ELSE v_now END,
                batch_end         = CASE WHEN pl.auto_ack THEN NULL ELSE pl.last END,
                total_consumed    = CASE WHEN pl.auto_ack THEN c.total_consumed + (pl.last - pl.first + 1)
                                         ELSE c.total_consumed END,
                last_consumed_at  = CASE WHEN pl.auto_ack THEN v_now ELSE c.last_consumed_at END,
                retry_count       = CASE WHEN pl.auto_ack THEN 0 ELSE c.retry_count END,
                attempt_count     = CASE WHEN pl.auto_ack THEN c.attempt_count
                                         WHEN c.attempt_offset IS NOT DISTINCT FROM pl.first
                                         THEN c.attempt_count + 1 ELSE 1 END,
                attempt_offset    = CASE WHEN pl.auto_ack THEN c.attempt_offset ELSE pl.first END
            FROM plan pl
            WHERE c.partition_id = pl.pid AND c.consumer_group = pl.grp
            RETURNING pl.slot, CASE WHEN pl.auto_ack THEN 1 ELSE c.attempt_count END AS attempt
        )
        SELECT o.slot, o.partition_id, o.partition, o.queue, o.kind, o.base_offset, o.start_idx, o.take,
               o.created_at, o.blob, o.first, o.last, o.attempt, o.msg_count
        FROM (
            -- The head segment, read above; the segments after it only
            -- where the claim goes past it.
            SELECT pl.slot, 0 AS rank, pl.pid AS partition_id, pl.pname AS partition, pl.qname AS queue,
                   'segment' AS kind, pl.head_base AS base_offset, (pl.first - pl.head_base)::integer AS start_idx,
                   (LEAST(pl.head_end, pl.last) - pl.first + 1)::integer AS take,
                   pl.head_at AS created_at, pl.head_blob AS blob, NULL::bigint AS first, NULL::bigint AS last,
                   NULL::integer AS attempt, pl.head_count AS msg_count
            FROM plan pl
            UNION ALL
            SELECT pl.slot, 0, pl.pid, pl.pname, pl.qname, 'segment', g.base_offset, 0,
                   (LEAST(g.end_offset, pl.last) - g.base_offset + 1)::integer, g.created_at,
                   CASE WHEN g.base_offset IS NOT DISTINCT FROM s.cached THEN NULL ELSE g.blob END,
                   NULL, NULL, NULL, g.msg_count
            FROM plan pl
            JOIN slot s ON s.slot = pl.slot
            JOIN queen.segments g ON g.partition_id = pl.pid
                 AND g.base_offset > pl.head_base AND g.base_offset <= pl.last
            WHERE pl.last > pl.head_end
            UNION ALL
            SELECT pl.slot, 1, pl.pid, pl.pname, pl.qname, 'claimed', pl.last_offset, NULL, NULL, NULL, NULL,
                   pl.first, pl.last, ls.attempt, NULL
            FROM plan pl JOIN leased ls ON ls.slot = pl.slot
            UNION ALL
            -- Locked elsewhere or leased: 'busy', when the cursor row exists
            -- (a missing one goes to step 2's full claim).
            SELECT u.slot, 1, u.pid, NULL, NULL, 'busy', NULL, NULL, NULL, NULL, NULL,
                   NULL, NULL, NULL, NULL
            FROM (SELECT s.slot, s.pid, s.grp FROM slot s
                  WHERE NOT EXISTS (SELECT 1 FROM locked l WHERE l.slot = s.slot)
                  OFFSET 0) u
            WHERE EXISTS (SELECT 1 FROM queen.consumers c
                          WHERE c.partition_id = u.pid AND c.consumer_group = u.grp)
        ) o
        ORDER BY o.slot, o.rank, o.base_offset
    LOOP
        RETURN NEXT;
        IF o_kind <> 'segment' THEN
            v_settled[o_slot] := true;
        END IF;
        IF o_kind = 'claimed' THEN
            v_taken[o_slot] := 1;
            v_used[o_slot] := (o_last - o_first + 1)::integer;
        END IF;
    END LOOP;
    -- 2. Each slot with budget and room left, through the per-partition
    --    list, from its first candidate step 1 did not settle.
    v_from := 1;
    FOR i IN 1..v_slots LOOP
        v_left := p_budgets[i] - v_used[i];
        v_skip := CASE WHEN v_settled[i] THEN 1 ELSE 0 END;
        IF v_left > 0 AND (p_max_partitions[i] <= 0 OR v_taken[i] < p_max_partitions[i])
           AND p_ends[i] >= v_from + v_skip THEN
            RETURN QUERY SELECT i, r.* FROM queen.pop_list_v2(
                p_pids[v_from + v_skip:p_ends[i]], p_cached[v_from + v_skip:p_ends[i]], p_groups[i], p_workers[i],
                p_lease_seconds[i], p_auto_ack[i], v_left,
                CASE WHEN p_max_partitions[i] > 0 THEN p_max_partitions[i] - v_taken[i] ELSE 0 END,
                p_intent_modes[i], p_intent_froms[i]) r;
        END IF;
        v_from := p_ends[i] + 1;
    END LOOP;
END
$$;
