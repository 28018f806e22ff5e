-- A claim says how far the partition goes (issue 51).
--
-- A claim puts its partition back at the tail of the hot-list's ring; the
-- next visit that finds it empty drops it. After an autoAck drain of
-- 100,000 one-message partitions the ring held every one of them, and
-- long-polls visited them a few at a time while new messages waited
-- behind: 0 of 5,000 delivered in 5 s.
--
-- The hot-list's two claim functions now answer, in the 'claimed' row's
-- o_base_offset (unused there until now), the partition's last offset as
-- the claim read it. An autoAck claim whose span ends there drained the
-- partition, and the broker drops it from the ring (src/pop/hotlist.rs,
-- Verdict::Drained). A message pushed after that read was committed after
-- the broker checked the partition out, so its push reaches the ring after
-- the checkout too: it keeps the partition, or offers it again. Messages
-- that delayedProcessing or windowBuffer hide are below the last offset,
-- so a claim that stops short of them does not look drained. A leased
-- claim's partition stays (a nack or an expired lease returns messages
-- without telling the ring).
--
-- pop_list_v1 reads every candidate's last offset before it claims; its
-- 'claimed' rows, the plain path's and queen.pop_claim_v1's alike, carry
-- that value. pop_list_set_v1 carries the one its claim statement read, and
-- so does pop_list_prefix_v1 (the SQL path's list), which answers the rows
-- pop_list_v1 answers.
-- Everything else is 0003_pop.sql's, unchanged; a broker of the previous
-- version ignores the column in a 'claimed' row.

CREATE OR REPLACE FUNCTION queen.pop_list_v1(
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
    v_now        timestamptz := clock_timestamp();
    v_left       integer := p_budget;
    v_claimed    integer := 0;
    v_committed  bigint;
    v_wanted     bigint;
    v_first      bigint;
    v_end        bigint;
    v_take       integer;
    v_attempt    integer;
    v_plain      boolean;
    k            record;
    s            record;
    r            record;
    v_row        queen.pop_row;
BEGIN
    FOR k IN
        SELECT u.pid, p.name AS pname, q.name AS qname, p.last_offset,
               COALESCE(q.window_buffer = 0 AND q.delayed_processing = 0, false) AS ungated,
               COALESCE(NULLIF(GREATEST(p_lease_seconds, 0), 0), q.lease_time, 60) AS lease
        FROM unnest(COALESCE(p_pids, '{}')) WITH ORDINALITY AS u (pid, ord)
        LEFT JOIN queen.partitions p ON p.id = u.pid  -- a vanished partition: the claim says 'empty'
        LEFT JOIN queen.queues q ON q.id = p.queue_id
        ORDER BY u.ord
    LOOP
        EXIT WHEN v_left <= 0 OR (p_max_partitions > 0 AND v_claimed >= p_max_partitions);
        v_plain := false;
        IF k.ungated THEN
            SELECT c.committed INTO v_committed FROM queen.consumers c
            WHERE c.partition_id = k.pid AND c.consumer_group = p_group
              AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                -- Leased, or locked by a concurrent pop: the claim's
                -- 'busy', said without a second lock attempt (under load
                -- most misses are this). A missing row goes to the claim.
                PERFORM 1 FROM queen.consumers c WHERE c.partition_id = k.pid AND c.consumer_group = p_group;
                IF FOUND THEN
                    v_row := (k.pid, k.pname, k.qname, 'busy', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
                    RETURN NEXT v_row;
                    CONTINUE;
                END IF;
            END IF;
            v_plain := FOUND AND k.last_offset > v_committed;
        END IF;
        IF v_plain THEN
            -- The segments from the one covering the next offset to the budget.
            v_wanted := v_committed + 1;
            v_first := NULL;
            FOR s IN
                SELECT g.base_offset, g.end_offset, g.msg_count, g.created_at, g.blob FROM queen.segments g
                WHERE g.partition_id = k.pid AND g.base_offset <= v_wanted + v_left - 1
                  AND g.base_offset >= (SELECT h.base_offset FROM queen.segments h
                                        WHERE h.partition_id = k.pid AND h.base_offset <= v_wanted
                                        ORDER BY h.base_offset DESC LIMIT 1)
                ORDER BY g.base_offset
            LOOP
                IF v_first IS NULL AND s.end_offset < v_wanted THEN
                    EXIT; -- the next offset is in no segment (nothing emitted yet): the claim decides
                END IF;
                v_take := (LEAST(s.end_offset, v_wanted + v_left - 1) - GREATEST(s.base_offset, v_wanted) + 1)::integer;
                v_first := COALESCE(v_first, v_wanted);
                v_end := GREATEST(s.base_offset, v_wanted) + v_take - 1;
                v_row := (k.pid, k.pname, k.qname, 'segment', s.base_offset,
                          GREATEST(v_wanted - s.base_offset, 0)::integer, v_take, s.created_at, s.blob,
                          NULL, NULL, NULL, s.msg_count);
                RETURN NEXT v_row; -- rows go out when the function ends, after the update
            END LOOP;
            v_plain := v_first IS NOT NULL;
        END IF;
        IF v_plain THEN
            IF p_auto_ack THEN
                UPDATE queen.consumers c SET
                    committed = v_end, worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL,
                    batch_end = NULL, total_consumed = c.total_consumed + (v_end - v_first + 1),
                    last_consumed_at = v_now, retry_count = 0
                WHERE c.partition_id = k.pid AND c.consumer_group = p_group;
                v_attempt := 1;
            ELSE
                UPDATE queen.consumers c SET
                    worker_id = p_worker,
                    lease_expires_at = v_now + make_interval(secs => k.lease),
                    lease_acquired_at = v_now,
                    batch_end = v_end,
                    attempt_count = CASE WHEN c.attempt_offset IS NOT DISTINCT FROM v_first
                                         THEN c.attempt_count + 1 ELSE 1 END,
                    attempt_offset = v_first
                WHERE c.partition_id = k.pid AND c.consumer_group = p_group
                RETURNING c.attempt_count INTO v_attempt;
            END IF;
            v_row := (k.pid, k.pname, k.qname, 'claimed', k.last_offset, NULL, NULL, NULL, NULL,
                      v_first, v_end, v_attempt, NULL);
            RETURN NEXT v_row;
            v_claimed := v_claimed + 1;
            v_left := v_left - (v_end - v_first + 1)::integer;
            CONTINUE;
        END IF;
        -- Everything else: the full claim (it re-reads the row this
        -- transaction may already hold; same transaction, no wait).
        FOR r IN SELECT * FROM queen.pop_claim_v1(k.pid, p_group, p_worker, p_lease_seconds, p_auto_ack,
                                                  v_left, p_intent_mode, p_intent_from, false) LOOP
            v_row := (k.pid, k.pname, k.qname, r.o_kind,
                      CASE WHEN r.o_kind = 'claimed' THEN k.last_offset ELSE r.o_base_offset END, r.o_start_idx, r.o_take,
                      r.o_created_at, r.o_blob, r.o_first, r.o_last, r.o_attempt, r.o_msg_count);
            RETURN NEXT v_row;
            IF r.o_kind = 'claimed' THEN
                v_claimed := v_claimed + 1;
                v_left := v_left - (r.o_last - r.o_first + 1)::integer;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION queen.pop_list_set_v1(
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
        RETURN QUERY SELECT * FROM queen.pop_list_v1(
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
                retry_count       = CASE WHEN p_auto_ack THEN 0 ELSE c.retry_count END,
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
            SELECT pl.ord, 1, pl.pid, pl.pname, pl.qname, 'claimed', pl.last_offset, NULL, NULL, NULL, NULL,
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
    RETURN QUERY SELECT * FROM queen.pop_list_v1(
        v_rest, p_group, p_worker, p_lease_seconds, p_auto_ack, v_left,
        CASE WHEN p_max_partitions > 0 THEN p_max_partitions - v_claimed ELSE 0 END,
        p_intent_mode, p_intent_from);
END
$$;

CREATE OR REPLACE FUNCTION queen.pop_list_prefix_v1(
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
    v_last     bigint[];
    v_pname    text[];
    v_qname    text[];
    v_lease    integer[];
    v_settled  bigint[] := '{}';
    v_rest     bigint[];
    v_left     integer := p_budget;
    v_claimed  integer := 0;
    r          queen.pop_row;
BEGIN
    -- A single candidate (a partition-scoped wake, a one-partition queue)
    -- costs less as pop_list_v1's few small statements than as steps 1 and 2.
    IF COALESCE(cardinality(p_pids), 0) < 2 THEN
        RETURN QUERY SELECT * FROM queen.pop_list_v1(
            p_pids, p_group, p_worker, p_lease_seconds, p_auto_ack, p_budget, p_max_partitions,
            p_intent_mode, p_intent_from);
        RETURN;
    END IF;

    -- 1. The plain-looking prefix (no locks; step 2 re-checks under them),
    -- with what step 2 needs of its partitions and queues. Only the first
    -- candidates that could all be claimed are looked at (each claimed
    -- partition takes at least one message and counts against
    -- p_max_partitions): a hot-list hands over up to 256. Every lookup goes
    -- by primary key from the candidate list; the queue is a lateral
    -- subquery kept apart (OFFSET 0) so that stale statistics cannot turn the
    -- join into a scan of all the queue's partitions.
    SELECT array_agg(t.pid ORDER BY t.ord), array_agg(t.last_offset ORDER BY t.ord),
           array_agg(t.pname ORDER BY t.ord), array_agg(t.qname ORDER BY t.ord),
           array_agg(t.lease ORDER BY t.ord)
    INTO v_try, v_last, v_pname, v_qname, v_lease
    FROM (SELECT u.pid, u.ord, p.last_offset, p.name AS pname, q.name AS qname,
                 COALESCE(NULLIF(GREATEST(p_lease_seconds, 0), 0), q.lease_time, 60) AS lease,
                 (sum(p.last_offset - c.committed) OVER w - (p.last_offset - c.committed))::bigint AS before,
                 row_number() OVER w AS n
          FROM unnest(COALESCE(p_pids, '{}')) WITH ORDINALITY AS u (pid, ord)
          JOIN queen.partitions p ON p.id = u.pid
          CROSS JOIN LATERAL (SELECT q.name, q.lease_time FROM queen.queues q
                              WHERE q.id = p.queue_id AND q.window_buffer = 0 AND q.delayed_processing = 0
                              OFFSET 0) q
          JOIN queen.consumers c ON c.partition_id = u.pid AND c.consumer_group = p_group
          WHERE u.ord <= LEAST(p_budget, CASE WHEN p_max_partitions > 0 THEN p_max_partitions ELSE p_budget END)
            AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
            AND p.last_offset > c.committed
          WINDOW w AS (ORDER BY u.ord)) t
    WHERE t.before < p_budget AND (p_max_partitions <= 0 OR t.n <= p_max_partitions);

    -- A single plain-looking candidate is cheaper through pop_list_v1 too: it goes
    -- there with the rest (step 3).
    IF cardinality(v_try) >= 2 THEN
        -- 2. Lock, plan, lease and read in one statement (one snapshot).
        FOR r IN
            WITH locked AS (
                SELECT c.partition_id AS pid, c.committed
                FROM queen.consumers c
                WHERE c.partition_id = ANY (v_try) AND c.consumer_group = p_group
                  AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
                FOR UPDATE SKIP LOCKED
            ), headed AS (
                SELECT u.pid, u.ord, l.committed + 1 AS first, u.last_offset, u.pname, u.qname,
                       u.lease, h.base_offset AS head_base
                FROM unnest(v_try, v_last, v_pname, v_qname, v_lease)
                     WITH ORDINALITY AS u (pid, last_offset, pname, qname, lease, ord)
                JOIN locked l ON l.pid = u.pid
                CROSS JOIN LATERAL (SELECT s.base_offset, s.end_offset FROM queen.segments s
                                    WHERE s.partition_id = u.pid AND s.base_offset <= l.committed + 1
                                    ORDER BY s.base_offset DESC LIMIT 1) h
                WHERE u.last_offset > l.committed AND h.end_offset > l.committed
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
                    retry_count       = CASE WHEN p_auto_ack THEN 0 ELSE c.retry_count END,
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
                SELECT pl.ord, 0 AS rank, pl.pid AS partition_id, pl.pname AS partition, pl.qname AS queue,
                       'segment' AS kind, g.base_offset, GREATEST(pl.first - g.base_offset, 0)::integer AS start_idx,
                       (LEAST(g.end_offset, pl.last) - GREATEST(g.base_offset, pl.first) + 1)::integer AS take,
                       g.created_at, g.blob, NULL::bigint AS first, NULL::bigint AS last,
                       NULL::integer AS attempt, g.msg_count
                FROM plan pl
                JOIN queen.segments g ON g.partition_id = pl.pid
                     AND g.base_offset >= pl.head_base AND g.base_offset <= pl.last
                UNION ALL
                SELECT pl.ord, 1, pl.pid, pl.pname, pl.qname, 'claimed', pl.last_offset, NULL, NULL, NULL, NULL,
                       pl.first, pl.last, ls.attempt, NULL
                FROM plan pl JOIN leased ls ON ls.pid = pl.pid
                UNION ALL
                -- Seen free a moment ago, locked by another pop now.
                SELECT u.ord, 1, u.pid, NULL, NULL, 'busy', NULL, NULL, NULL, NULL, NULL,
                       NULL, NULL, NULL, NULL
                FROM unnest(v_try) WITH ORDINALITY AS u (pid, ord)
                WHERE NOT EXISTS (SELECT 1 FROM locked l WHERE l.pid = u.pid)
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
    END IF;

    -- 3. The rest, in order, through the per-partition path.
    IF v_left <= 0 OR (p_max_partitions > 0 AND v_claimed >= p_max_partitions) THEN
        RETURN;
    END IF;
    SELECT array_agg(u.pid ORDER BY u.ord) INTO v_rest
    FROM unnest(COALESCE(p_pids, '{}')) WITH ORDINALITY AS u (pid, ord)
    WHERE u.pid <> ALL (v_settled);
    IF v_rest IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM queen.pop_list_v1(
        v_rest, p_group, p_worker, p_lease_seconds, p_auto_ack, v_left,
        CASE WHEN p_max_partitions > 0 THEN p_max_partitions - v_claimed ELSE 0 END,
        p_intent_mode, p_intent_from);
END
$$;
