-- A claim of one partition is one statement when the partition is plain
-- (issues 46 and 51).
--
-- queen.pop_list_v2 (0049) walks its candidates in PL/pgSQL: for the first
-- one it reads the candidates with their partitions and queues, locks the
-- cursor row, reads the segments and leases, four statements. In the
-- clients' default loop (one consumer, pop batch 1 + ack) each of them costs
-- more to start than to run: the call took 0.37 ms of PostgreSQL against
-- 0.09 for its statements' execution (pg_stat_statements), and a drain of
-- ten deep partitions (pop batch 100, 4 consumers) spent 0.29–0.35 ms a
-- claim.
--
-- queen.pop_list_v3 takes the same arguments and answers the same rows. Its
-- first candidate, when plain, is claimed in one statement: lock the cursor
-- row (SKIP LOCKED, unleased only), check that something lies past it, read
-- the segments from the one holding the next offset to the budget, lease.
-- A held segment (p_cached) comes back with a NULL blob and is not read, as
-- in pop_list_v2. With budget left and more candidates, pop_list_v2 goes on
-- from the second. A first candidate the statement cannot claim (leased or
-- locked elsewhere, no cursor row yet, a gated queue, nothing past the
-- cursor, no segment holding the next offset, a partition gone) is left to
-- pop_list_v2 with every candidate, which answers it as before ('busy',
-- the full claim); the statement took no lease and wrote nothing, and a row
-- it locked is this transaction's, so pop_list_v2 reads it again without
-- waiting. Measured against the build before, alternating fresh clusters,
-- medians of three: the ten-partition drain 85,167 against 76,016 msg/s
-- (0.21-0.27 against 0.29-0.30 ms a claim), the one-consumer loop 707
-- against 676, four consumers 1,698 against 1,619.
--
-- The claim rules do not change: claim-first with SKIP LOCKED, one lease per
-- partition and group. pop_list_v2 stays for a broker of the previous
-- version during a rolling upgrade, and for the rest of the candidates.
CREATE FUNCTION queen.pop_list_v3(
    p_pids           bigint[],
    p_cached         bigint[],
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
    v_now     timestamptz := clock_timestamp();
    v_pid     bigint := p_pids[1];
    v_used    integer;
    r         queen.pop_row;
BEGIN
    IF v_pid IS NOT NULL AND p_budget > 0 THEN
        FOR r IN
            WITH locked AS (
                SELECT c.committed FROM queen.consumers c
                WHERE c.partition_id = v_pid AND c.consumer_group = p_group
                  AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
                FOR UPDATE SKIP LOCKED
            ), plan AS (
                SELECT l.committed + 1 AS first, LEAST(p.last_offset, l.committed + p_budget) AS last,
                       p.last_offset, p.name AS pname, q.name AS qname,
                       COALESCE(NULLIF(GREATEST(p_lease_seconds, 0), 0), q.lease_time, 60) AS lease,
                       h.base_offset AS head_base, h.end_offset AS head_end, h.created_at AS head_at,
                       h.blob AS head_blob, h.msg_count AS head_count
                FROM locked l
                JOIN queen.partitions p ON p.id = v_pid
                JOIN queen.queues q ON q.id = p.queue_id AND q.window_buffer = 0 AND q.delayed_processing = 0
                CROSS JOIN LATERAL (SELECT g.base_offset, g.end_offset, g.created_at, g.msg_count,
                                           CASE WHEN g.base_offset IS NOT DISTINCT FROM p_cached[1] THEN NULL ELSE g.blob END AS blob
                                    FROM queen.segments g
                                    WHERE g.partition_id = v_pid AND g.base_offset <= l.committed + 1
                                    ORDER BY g.base_offset DESC LIMIT 1) h
                WHERE p.last_offset > l.committed AND h.end_offset > l.committed
            ), leased AS (
                UPDATE queen.consumers c SET
                    committed         = CASE WHEN p_auto_ack THEN pl.last ELSE c.committed END,
                    worker_id         = CASE WHEN p_auto_ack THEN NULL ELSE p_worker END,
                    lease_expires_at  = CASE WHEN p_auto_ack THEN NULL ELSE v_now + make_interval(secs => pl.lease) END,
                    lease_acquired_at = CASE WHEN p_auto_ack THEN NULL ELSE v_now END,
                    batch_end         = CASE WHEN p_auto_ack THEN NULL ELSE pl.last END,
                    total_consumed    = CASE WHEN p_auto_ack THEN c.total_consumed + (pl.last - pl.first + 1)
                                             ELSE c.total_consumed END,
                    last_consumed_at  = CASE WHEN p_auto_ack THEN v_now ELSE c.last_consumed_at END,
                    retry_count       = CASE WHEN p_auto_ack THEN 0 ELSE c.retry_count END,
                    attempt_count     = CASE WHEN p_auto_ack THEN c.attempt_count
                                             WHEN c.attempt_offset IS NOT DISTINCT FROM pl.first
                                             THEN c.attempt_count + 1 ELSE 1 END,
                    attempt_offset    = CASE WHEN p_auto_ack THEN c.attempt_offset ELSE pl.first END
                FROM plan pl
                WHERE c.partition_id = v_pid AND c.consumer_group = p_group
                RETURNING CASE WHEN p_auto_ack THEN 1 ELSE c.attempt_count END AS attempt
            )
            SELECT o.partition_id, o.partition, o.queue, o.kind, o.base_offset, o.start_idx, o.take,
                   o.created_at, o.blob, o.first, o.last, o.attempt, o.msg_count
            FROM (
                -- The head segment, read above; the segments after it only
                -- where the claim goes past it.
                SELECT 0 AS rank, v_pid AS partition_id, pl.pname AS partition, pl.qname AS queue,
                       'segment' AS kind, pl.head_base AS base_offset, (pl.first - pl.head_base)::integer AS start_idx,
                       (LEAST(pl.head_end, pl.last) - pl.first + 1)::integer AS take,
                       pl.head_at AS created_at, pl.head_blob AS blob, NULL::bigint AS first, NULL::bigint AS last,
                       NULL::integer AS attempt, pl.head_count AS msg_count
                FROM plan pl
                UNION ALL
                SELECT 0, v_pid, pl.pname, pl.qname, 'segment', g.base_offset, 0,
                       (LEAST(g.end_offset, pl.last) - g.base_offset + 1)::integer, g.created_at,
                       CASE WHEN g.base_offset IS NOT DISTINCT FROM p_cached[1] THEN NULL ELSE g.blob END,
                       NULL, NULL, NULL, g.msg_count
                FROM plan pl
                JOIN queen.segments g ON g.partition_id = v_pid AND g.base_offset > pl.head_base AND g.base_offset <= pl.last
                WHERE pl.last > pl.head_end
                UNION ALL
                SELECT 1, v_pid, pl.pname, pl.qname, 'claimed', pl.last_offset, NULL, NULL, NULL, NULL,
                       pl.first, pl.last, ls.attempt, NULL
                FROM plan pl CROSS JOIN leased ls
            ) o
            ORDER BY o.rank, o.base_offset
        LOOP
            RETURN NEXT r;
            IF r.o_kind = 'claimed' THEN
                v_used := (r.o_last - r.o_first + 1)::integer;
            END IF;
        END LOOP;
    END IF;
    IF v_used IS NULL THEN
        -- Not claimed here: every candidate through the per-partition list.
        RETURN QUERY SELECT * FROM queen.pop_list_v2(
            p_pids, p_cached, p_group, p_worker, p_lease_seconds, p_auto_ack, p_budget, p_max_partitions,
            p_intent_mode, p_intent_from);
    ELSIF p_budget > v_used AND p_max_partitions <> 1 AND cardinality(p_pids) > 1 THEN
        RETURN QUERY SELECT * FROM queen.pop_list_v2(
            p_pids[2:], p_cached[2:], p_group, p_worker, p_lease_seconds, p_auto_ack, p_budget - v_used,
            CASE WHEN p_max_partitions > 0 THEN p_max_partitions - 1 ELSE 0 END, p_intent_mode, p_intent_from);
    END IF;
END
$$;
