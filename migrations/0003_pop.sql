-- The pop path (seeds/life-of-a-pop.md): where a cursor starts, the claim
-- of one partition, the lists that claim many, the three routes, and the
-- queries behind the broker's hot-list.
--
-- How a pop reaches the claim:
--   * the broker's hot-list picked the candidates: queen.pop_list_set_v1
--     (several partitions) or queen.pop_list_v1 (one, or a deep one), and
--     queen.pop_claim_v1 directly for a windowBuffer partition whose hold the
--     broker timed;
--   * the SQL candidate path: queen.pop_wildcard_v1 and queen.pop_discover_v1
--     pick candidates (queen.pop_candidates_v1) and claim through
--     queen.pop_list_prefix_v1;
--   * the single-partition route: queen.pop_specific_v1.
-- Every list ends in queen.pop_list_v1, and everything that is not the plain
-- case (a free cursor row with the next offset's segment present, on a queue
-- that gates nothing) ends in queen.pop_claim_v1: one home for the claim's
-- rules. Rows come back as queen.pop_row (0001_schema.sql).
--
-- Invariants:
--   * claim-first: no statement here waits on another transaction's row.
--     Cursor rows are claimed FOR UPDATE SKIP LOCKED; a missing one is
--     created only by the pop that wins a *try* advisory lock, so a wildcard
--     pop whose transaction spans its whole candidate loop never joins a wait
--     chain (a blocking insert there formed chains the deadlock detector
--     cannot break);
--   * the lease span: a leased claim writes worker_id, lease_expires_at and
--     batch_end, covering (committed, batch_end], and does not move the
--     cursor; only an ack (0004_ack.sql) or an autoAck claim moves it;
--   * an existing cursor is never re-seeded; seeding follows one order
--     (queen.seed_cursor_v1);
--   * delayedProcessing is always enforced here; the windowBuffer debounce
--     is skipped only where the broker times the hold itself.

-- The offset just before the first segment written at or after p_ts (a
-- forward walk from the retention watermark); the partition's end when
-- nothing is that recent. Segment-granular by design.
CREATE FUNCTION queen.offset_before_v1(p_pid bigint, p_ts timestamptz)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(
        (SELECT s.base_offset - 1 FROM queen.segments s
         WHERE s.partition_id = p_pid AND s.base_offset >= p.log_start AND s.created_at >= p_ts
         ORDER BY s.base_offset LIMIT 1),
        p.last_offset)
    FROM queen.partitions p WHERE p.id = p_pid
$$;

-- Where a (partition, group) cursor starts on first contact. The one home
-- of the seeding order:
--   1. the group's durable subscription record (NULL timestamp = everything);
--   2. the pop-carried intent: a timestamp, or 'new' = the current end;
--   3. -1, the whole retained backlog.
-- Queue mode skips 1 and 2: it never skips backlog.
CREATE FUNCTION queen.seed_cursor_v1(p_pid bigint, p_qid bigint, p_group text,
                                     p_intent_mode text, p_intent_from timestamptz)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_found boolean;
    v_ts    timestamptz;
BEGIN
    IF p_group = '__QUEUE_MODE__' THEN
        RETURN -1;
    END IF;
    SELECT true, s.subscription_timestamp INTO v_found, v_ts
    FROM queen.subscriptions s WHERE s.queue_id = p_qid AND s.consumer_group = p_group;
    IF v_found THEN
        RETURN CASE WHEN v_ts IS NULL THEN -1 ELSE queen.offset_before_v1(p_pid, v_ts) END;
    END IF;
    IF p_intent_from IS NOT NULL THEN
        RETURN queen.offset_before_v1(p_pid, p_intent_from);
    END IF;
    IF p_intent_mode = 'new' THEN
        RETURN (SELECT p.last_offset FROM queen.partitions p WHERE p.id = p_pid);
    END IF;
    RETURN -1;
END
$$;

-- Claims what this group may take from one partition right now.
--
-- Rows: one 'segment' row per segment to deliver (base offset, the frames
-- [start_idx, start_idx + take) to slice, created_at, blob), then one
-- 'claimed' row with the delivered span and the attempt count; or a single
-- verdict row: 'busy' (leased, locked, or being created by another pop),
-- 'deferred' (held by windowBuffer or delayedProcessing), 'empty'.
--
-- A 'deferred' row carries in o_created_at the moment the partition's head
-- becomes claimable: the newest write + windowBuffer for the quiet-period
-- debounce, the first hidden segment's created_at + delayedProcessing for a
-- delay. The broker's revisit wheel (pop::wheel) opens the queue's wake gate
-- then, instead of leaving parked pops to their backoff.
--
-- p_skip_window: the hot-list path times the windowBuffer hold in the broker
-- (ending at the window or when the waiting batch is full) and then claims
-- with the SQL debounce skipped. Every other caller passes false: the
-- debounce stays the safe floor wherever the broker does not hold the
-- partition itself. delayedProcessing is never skipped.
--
-- An autoAck claim moves the cursor and resets retry_count, which belongs to
-- the message just past the cursor: the next message starts with its whole
-- retry budget.
CREATE FUNCTION queen.pop_claim_v1(
    p_pid            bigint,
    p_group          text,
    p_worker         text,
    p_lease_seconds  integer,      -- NULL or <= 0: the queue's leaseTime
    p_auto_ack       boolean,
    p_budget         integer,
    p_intent_mode    text,
    p_intent_from    timestamptz,
    p_skip_window    boolean)      -- the broker times the windowBuffer hold itself
RETURNS TABLE (o_kind text, o_base_offset bigint, o_start_idx integer, o_take integer,
               o_created_at timestamptz, o_blob bytea, o_first bigint, o_last bigint, o_attempt integer,
               o_msg_count integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := clock_timestamp();
    v_qid        bigint;
    v_last       bigint;
    v_last_write timestamptz;
    v_lease      integer;
    v_delayed    integer;
    v_window     integer;
    v_committed  bigint;
    v_wanted     bigint;
    v_left       integer := p_budget;
    v_first      bigint;
    v_end        bigint;
    v_deferred   boolean := false;
    v_take       integer;
    v_attempt    integer;
    v_visible_at timestamptz;      -- a deferred partition: when its head becomes visible
    rec          record;
BEGIN
    SELECT p.queue_id, p.last_offset, p.last_write_at,
           COALESCE(NULLIF(GREATEST(p_lease_seconds, 0), 0), q.lease_time, 60),
           q.delayed_processing, q.window_buffer
    INTO v_qid, v_last, v_last_write, v_lease, v_delayed, v_window
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE p.id = p_pid;
    IF v_qid IS NULL OR p_budget <= 0 THEN
        o_kind := 'empty'; RETURN NEXT; RETURN;
    END IF;

    -- Visibility gate 1: windowBuffer holds a partition still being written.
    -- last_write_at is the newest segment's created_at.
    IF v_window > 0 AND NOT p_skip_window AND v_last_write > v_now - make_interval(secs => v_window) THEN
        o_kind := 'deferred'; o_created_at := v_last_write + make_interval(secs => v_window);
        RETURN NEXT; RETURN;
    END IF;

    -- The claim: non-blocking; a live lease or a concurrent claim skips.
    SELECT c.committed INTO v_committed FROM queen.consumers c
    WHERE c.partition_id = p_pid AND c.consumer_group = p_group
      AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Missing, or present but leased/locked? Only a missing row is created,
        -- and only by the pop that wins the try-lock: never a blocking insert.
        PERFORM 1 FROM queen.consumers c WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
        IF FOUND OR NOT pg_try_advisory_xact_lock(hashtextextended(p_pid::text || '/' || p_group, 42)) THEN
            o_kind := 'busy'; RETURN NEXT; RETURN;
        END IF;
        INSERT INTO queen.consumers (partition_id, consumer_group, committed)
        VALUES (p_pid, p_group, queen.seed_cursor_v1(p_pid, v_qid, p_group, p_intent_mode, p_intent_from))
        ON CONFLICT DO NOTHING;
        SELECT c.committed INTO v_committed FROM queen.consumers c
        WHERE c.partition_id = p_pid AND c.consumer_group = p_group
          AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            o_kind := 'busy'; RETURN NEXT; RETURN;
        END IF;
    END IF;

    v_wanted := v_committed + 1;
    IF v_last >= v_wanted THEN
        -- Head probe: one backward primary-key step; a miss cannot walk the head.
        SELECT s.base_offset, s.end_offset, s.created_at, s.blob INTO rec
        FROM queen.segments s
        WHERE s.partition_id = p_pid AND s.base_offset <= v_wanted
        ORDER BY s.base_offset DESC LIMIT 1;
        IF FOUND AND rec.end_offset >= v_wanted THEN
            -- Visibility gate 2: delayedProcessing, always enforced here.
            IF v_delayed > 0 AND rec.created_at > v_now - make_interval(secs => v_delayed) THEN
                v_deferred := true;
                v_visible_at := rec.created_at + make_interval(secs => v_delayed);
            ELSE
                v_take := LEAST(rec.end_offset - v_wanted + 1, v_left)::integer;
                o_kind := 'segment'; o_base_offset := rec.base_offset;
                o_start_idx := (v_wanted - rec.base_offset)::integer; o_take := v_take;
                o_created_at := rec.created_at; o_blob := rec.blob;
                o_msg_count := (rec.end_offset - rec.base_offset + 1)::integer;
                RETURN NEXT;
                v_first := v_wanted; v_end := v_wanted + v_take - 1; v_left := v_left - v_take;
            END IF;
        END IF;
        -- Forward scan: a cursor, so stopping at the budget stops the index walk.
        IF v_left > 0 AND NOT v_deferred THEN
            FOR rec IN
                SELECT s.base_offset, s.msg_count, s.created_at, s.blob FROM queen.segments s
                WHERE s.partition_id = p_pid AND s.base_offset > v_wanted
                ORDER BY s.base_offset
            LOOP
                -- created_at is monotone: the delayed tail is contiguous.
                IF v_delayed > 0 AND rec.created_at > v_now - make_interval(secs => v_delayed) THEN
                    v_deferred := v_first IS NULL;
                    v_visible_at := rec.created_at + make_interval(secs => v_delayed);
                    EXIT;
                END IF;
                v_take := LEAST(rec.msg_count, v_left);
                o_kind := 'segment'; o_base_offset := rec.base_offset; o_start_idx := 0; o_take := v_take;
                o_created_at := rec.created_at; o_blob := rec.blob; o_msg_count := rec.msg_count;
                RETURN NEXT;
                v_first := COALESCE(v_first, rec.base_offset);
                v_end := rec.base_offset + v_take - 1;
                v_left := v_left - v_take;
                EXIT WHEN v_left = 0;
            END LOOP;
        END IF;
    END IF;

    IF v_first IS NULL THEN
        -- The empty-partition seal: only when the partition holds no segment at
        -- all (retention took everything) and nothing was filtered; anything
        -- pushed after v_last stays above the seal.
        IF NOT v_deferred AND v_last > v_committed
           AND NOT EXISTS (SELECT 1 FROM queen.segments s WHERE s.partition_id = p_pid) THEN
            UPDATE queen.consumers c SET committed = v_last
            WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
        END IF;
        o_kind := CASE WHEN v_deferred THEN 'deferred' ELSE 'empty' END;
        o_created_at := CASE WHEN v_deferred THEN v_visible_at END;
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_auto_ack THEN
        -- At-most-once: committed inside the pop, no lease.
        UPDATE queen.consumers c SET
            committed = v_end, worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL,
            batch_end = NULL, total_consumed = c.total_consumed + (v_end - v_first + 1),
            last_consumed_at = v_now, retry_count = 0
        WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
        v_attempt := 1;
    ELSE
        -- The lease covers (committed, batch_end]; the cursor does not move.
        -- Same start as the last delivery = a redelivery: attempt_count + 1
        -- (telemetry only; it never spends the retry budget).
        UPDATE queen.consumers c SET
            worker_id = p_worker,
            lease_expires_at = v_now + make_interval(secs => v_lease),
            lease_acquired_at = v_now,
            batch_end = v_end,
            attempt_count = CASE WHEN c.attempt_offset IS NOT DISTINCT FROM v_first
                                 THEN c.attempt_count + 1 ELSE 1 END,
            attempt_offset = v_first
        WHERE c.partition_id = p_pid AND c.consumer_group = p_group
        RETURNING c.attempt_count INTO v_attempt;
    END IF;
    o_kind := 'claimed'; o_base_offset := NULL; o_start_idx := NULL; o_take := NULL;
    o_created_at := NULL; o_blob := NULL; o_msg_count := NULL;
    o_first := v_first; o_last := v_end; o_attempt := v_attempt;
    RETURN NEXT;
END
$$;

-- The list every claim ends in: claims the candidates in the given order
-- until the budget is spent or p_max_partitions (0 = no cap) have been
-- claimed; candidates after the stop return nothing (unvisited).
--
-- It reads every candidate's partition and queue in one statement and claims
-- the plain case itself: the queue gates nothing (no windowBuffer, no
-- delayedProcessing), the group's cursor row exists and is free, and the
-- segment holding the next message is there. Then one locking read of the
-- cursor, one read of the segments to deliver (from the one covering the
-- next offset, as far as the budget reaches), one update: queen.pop_claim_v1's
-- rules for that case exactly (the lease or the autoAck commit, the attempt
-- telemetry). A cursor row that exists but is leased or locked answers
-- 'busy', as the claim would. Anything else (a missing row, an empty
-- partition, a gated queue, a head segment gone to retention) goes to
-- queen.pop_claim_v1. Calling the claim per partition instead cost ~80 µs
-- of PostgreSQL per claimed partition (a call and six statements).
CREATE FUNCTION queen.pop_list_v1(
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
            v_row := (k.pid, k.pname, k.qname, 'claimed', NULL, NULL, NULL, NULL, NULL,
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
            v_row := (k.pid, k.pname, k.qname, r.o_kind, r.o_base_offset, r.o_start_idx, r.o_take,
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

-- The hot-list's claim of several partitions in one pass over their cursor
-- rows. At 100,000 partitions a pop of 500 spans 50 partitions of 10
-- messages, and PostgreSQL's work per partition bounds the drain.
--
--   1. One statement locks the first LEAST(budget, partition cap)
--      candidates' cursor rows at once (SKIP LOCKED), checks under the lock
--      that each is free, has a backlog and an ungated queue, plans the
--      budget across them, leases (or autoAck-commits) the claimed rows and
--      returns their segments and 'claimed' rows, plus 'busy' for rows
--      another transaction held. A pop whose first partition fills its
--      budget still claims only that one, but locks the other rows until its
--      commit; the broker sends such claims to queen.pop_list_v1 instead (a
--      ring whose last claim came from one partition, pop::hotlist).
--   2. Every candidate the statement left (a missing row, a gated queue, a
--      gap at the head, a budget left by a busy row) goes to
--      queen.pop_list_v1 in the original order, with what is left of the
--      budget.
--
-- The update finds its rows by key, not by the ctid the lock returned: a row
-- updated and committed after the statement's snapshot is locked in its new
-- version, which a ctid scan under that snapshot cannot see, so the lease
-- would silently not be written. The head segment's row, found to check that
-- the next offset is there, is the first segment delivered: the segments
-- after it are read only for a claim that goes past it.
--
-- Same arguments and rows as queen.pop_list_v1; a partition's segment rows
-- come before its 'claimed' row.
CREATE FUNCTION queen.pop_list_set_v1(
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
    RETURN QUERY SELECT * FROM queen.pop_list_v1(
        v_rest, p_group, p_worker, p_lease_seconds, p_auto_ack, v_left,
        CASE WHEN p_max_partitions > 0 THEN p_max_partitions - v_claimed ELSE 0 END,
        p_intent_mode, p_intent_from);
END
$$;

-- The SQL candidate path's claim of several partitions, which locks only
-- what it will claim:
--
--   1. an unlocked read picks the prefix of the candidates that look plain,
--      as far as the budget and p_max_partitions reach (so that a pop whose
--      first partition fills its budget locks no other row); offsets stay
--      bigint throughout (a numeric bound would not be an index condition,
--      and the segment read would walk a deep partition to its end);
--   2. one statement locks those cursor rows (SKIP LOCKED), re-plans the
--      budget from what it locked, checks that the segment holding each next
--      offset is there, updates the claimed rows (queen.pop_claim_v1's lease
--      or autoAck commit and attempt rules) and returns their segments and
--      'claimed' rows, plus 'busy' for rows another pop held;
--   3. every candidate the statement left goes to queen.pop_list_v1 in the
--      original order, with what is left of the budget.
--
-- queen.pop_list_set_v1 does steps 1 and 2 in one statement, but holds the
-- locks of every candidate up to the budget; the hot-list steers deep claims
-- away from it, and the SQL path has no such history, so it keeps this one.
-- A single candidate goes to queen.pop_list_v1 directly (an idle broker's
-- wake: p90 0.9 ms there against 1.2 ms through steps 1 and 2).
--
-- Same arguments and rows as queen.pop_list_v1.
CREATE FUNCTION queen.pop_list_prefix_v1(
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
                SELECT pl.ord, 1, pl.pid, pl.pname, pl.qname, 'claimed', NULL, NULL, NULL, NULL, NULL,
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

-- The single-partition route: provisions the queue row, resolves the named
-- partition (it is not created), claims it. No durable subscription is
-- written; the cursor is seeded from the record if one exists, else the
-- request's intent.
CREATE FUNCTION queen.pop_specific_v1(
    p_queue          text,
    p_partition      text,
    p_group          text,
    p_worker         text,
    p_lease_seconds  integer,
    p_auto_ack       boolean,
    p_budget         integer,
    p_intent_mode    text,
    p_intent_from    timestamptz)
RETURNS SETOF queen.pop_row
LANGUAGE plpgsql AS $$
DECLARE
    v_qid  bigint := queen.ensure_queue_v1(p_queue);
    v_pid  bigint;
BEGIN
    SELECT p.id INTO v_pid FROM queen.partitions p WHERE p.queue_id = v_qid AND p.name = p_partition;
    IF v_pid IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT v_pid, p_partition, p_queue, c.o_kind, c.o_base_offset, c.o_start_idx, c.o_take,
           c.o_created_at, c.o_blob, c.o_first, c.o_last, c.o_attempt, c.o_msg_count
    FROM queen.pop_claim_v1(v_pid, p_group, p_worker, p_lease_seconds, p_auto_ack,
                            p_budget, p_intent_mode, p_intent_from, false) c;
END
$$;

-- First contact of (queue, group) on the wildcard and discovery paths: the
-- subscription record, then one cursor per partition in one statement (the
-- first insertion elects the one seeder; concurrent first contacts wait for
-- it). Returns whether this call was the seeder. Unlike seed_cursor_v1 per
-- row, the seed is a constant for a group that starts at the beginning: at
-- 100,000 partitions 0.36 s against 1.02 s row by row. Creating cursors
-- lazily instead, each in the claim that first needs it, was measured and
-- lost (a 100,000-partition drain 8.6 s instead of 7.6).
CREATE FUNCTION queen.register_group_v1(p_qid bigint, p_group text,
                                        p_intent_mode text, p_intent_from timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_rows integer;
    v_ts   timestamptz;
BEGIN
    -- Checked first: the SQL path registers on every pop.
    PERFORM 1 FROM queen.subscriptions s WHERE s.queue_id = p_qid AND s.consumer_group = p_group;
    IF FOUND THEN
        RETURN false;
    END IF;
    v_ts := CASE WHEN p_group = '__QUEUE_MODE__' THEN NULL
                 WHEN p_intent_from IS NOT NULL THEN p_intent_from
                 WHEN p_intent_mode = 'new' THEN now() ELSE NULL END;
    INSERT INTO queen.subscriptions (queue_id, consumer_group, subscription_mode, subscription_timestamp)
    VALUES (p_qid, p_group,
            CASE WHEN p_group = '__QUEUE_MODE__' THEN 'all'
                 WHEN p_intent_from IS NOT NULL THEN 'timestamp'
                 WHEN p_intent_mode = 'new' THEN 'new' ELSE 'all' END,
            v_ts)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows = 0 THEN
        RETURN false;
    END IF;
    -- seed_cursor_v1's rule for a group whose record was just written.
    IF v_ts IS NULL THEN
        INSERT INTO queen.consumers (partition_id, consumer_group, committed)
        SELECT p.id, p_group, -1 FROM queen.partitions p WHERE p.queue_id = p_qid
        ON CONFLICT DO NOTHING;
    ELSE
        INSERT INTO queen.consumers (partition_id, consumer_group, committed)
        SELECT p.id, p_group, queen.offset_before_v1(p.id, v_ts) FROM queen.partitions p WHERE p.queue_id = p_qid
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN true;
END
$$;

-- The SQL candidate scan of one queue for one group: recently written (the
-- write watermark), pending, not leased, in random order so that many
-- consumers spread out, capped. Stale candidates are harmless: the claim
-- re-verifies under the row lock.
CREATE FUNCTION queen.pop_candidates_v1(p_qid bigint, p_group text, p_cap integer)
RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(array_agg(x.id), '{}') FROM (
        SELECT p.id FROM queen.partitions p
        LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
        WHERE p.queue_id = p_qid
          AND p.last_write_at >= COALESCE(
                (SELECT w.watermark FROM queen.scan_watermarks w
                 WHERE w.queue_id = p_qid AND w.consumer_group = p_group), '-infinity') - interval '2 minutes'
          AND (c.partition_id IS NULL OR p.last_offset > c.committed)
          AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < clock_timestamp())
        ORDER BY random()
        LIMIT p_cap) x
$$;

-- Pending data for the group in the queue, ignoring leases: false means
-- definitively nothing to deliver (a lease-held backlog counts as pending).
CREATE FUNCTION queen.has_pending_v1(p_qid bigint, p_group text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM queen.partitions p
        LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
        WHERE p.queue_id = p_qid
          AND p.last_write_at >= COALESCE(
                (SELECT w.watermark FROM queen.scan_watermarks w
                 WHERE w.queue_id = p_qid AND w.consumer_group = p_group), '-infinity') - interval '2 minutes'
          AND (c.partition_id IS NULL OR p.last_offset > c.committed))
$$;

-- After a scan that claimed nothing: at most every 30 seconds, re-check
-- ignoring leases and advance the watermark to p_scan_start only when the
-- queue is genuinely empty for the group; otherwise keep the floor, so a
-- lease-held backlog is never stranded.
CREATE FUNCTION queen.note_empty_scan_v1(p_qid bigint, p_group text, p_scan_start timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_checked timestamptz;
BEGIN
    SELECT w.checked_at INTO v_checked FROM queen.scan_watermarks w
    WHERE w.queue_id = p_qid AND w.consumer_group = p_group;
    IF v_checked IS NOT NULL AND v_checked > p_scan_start - interval '30 seconds' THEN
        RETURN;
    END IF;
    IF queen.has_pending_v1(p_qid, p_group) THEN
        INSERT INTO queen.scan_watermarks AS w (queue_id, consumer_group, checked_at)
        VALUES (p_qid, p_group, p_scan_start)
        ON CONFLICT (queue_id, consumer_group) DO UPDATE SET checked_at = EXCLUDED.checked_at;
    ELSE
        INSERT INTO queen.scan_watermarks AS w (queue_id, consumer_group, watermark, checked_at)
        VALUES (p_qid, p_group, p_scan_start, p_scan_start)
        ON CONFLICT (queue_id, consumer_group)
        DO UPDATE SET watermark = GREATEST(w.watermark, EXCLUDED.watermark), checked_at = EXCLUDED.checked_at;
    END IF;
END
$$;

-- The wildcard route on the SQL candidate path: provisions the queue row,
-- registers the group on first contact, claims from the candidate scan, and
-- after a scan that claimed nothing lets the empty-scan watermark move.
CREATE FUNCTION queen.pop_wildcard_v1(
    p_queue          text,
    p_group          text,
    p_worker         text,
    p_lease_seconds  integer,
    p_auto_ack       boolean,
    p_budget         integer,
    p_max_partitions integer,
    p_intent_mode    text,
    p_intent_from    timestamptz,
    p_cand_cap       integer)
RETURNS SETOF queen.pop_row
LANGUAGE plpgsql AS $$
DECLARE
    v_qid      bigint := queen.ensure_queue_v1(p_queue);
    v_start    timestamptz := clock_timestamp();
    v_claimed  boolean := false;
    r          queen.pop_row;
BEGIN
    PERFORM queen.register_group_v1(v_qid, p_group, p_intent_mode, p_intent_from);
    FOR r IN SELECT * FROM queen.pop_list_prefix_v1(queen.pop_candidates_v1(v_qid, p_group, p_cand_cap),
                                             p_group, p_worker, p_lease_seconds, p_auto_ack, p_budget,
                                             p_max_partitions, p_intent_mode, p_intent_from) LOOP
        v_claimed := v_claimed OR r.o_kind = 'claimed';
        RETURN NEXT r;
    END LOOP;
    IF NOT v_claimed THEN
        PERFORM queen.note_empty_scan_v1(v_qid, p_group, v_start);
    END IF;
END
$$;

-- The discovery route: every queue whose labels match (NULL matches any),
-- registered in id order, candidates drawn from all of them at random up to
-- the cap, one claim across them.
CREATE FUNCTION queen.pop_discover_v1(
    p_namespace      text,
    p_task           text,
    p_group          text,
    p_worker         text,
    p_lease_seconds  integer,
    p_auto_ack       boolean,
    p_budget         integer,
    p_max_partitions integer,
    p_intent_mode    text,
    p_intent_from    timestamptz,
    p_cand_cap       integer)
RETURNS SETOF queen.pop_row
LANGUAGE plpgsql AS $$
DECLARE
    v_qids   bigint[];
    v_qid    bigint;
    v_cands  bigint[] := '{}';
BEGIN
    SELECT COALESCE(array_agg(q.id ORDER BY q.id), '{}') INTO v_qids FROM queen.queues q
    WHERE (p_namespace IS NULL OR q.namespace = p_namespace) AND (p_task IS NULL OR q.task = p_task);
    FOREACH v_qid IN ARRAY v_qids LOOP
        PERFORM queen.register_group_v1(v_qid, p_group, p_intent_mode, p_intent_from);
        v_cands := v_cands || queen.pop_candidates_v1(v_qid, p_group, p_cand_cap);
    END LOOP;
    SELECT COALESCE(array_agg(x.id), '{}') INTO v_cands
    FROM (SELECT u.id FROM unnest(v_cands) AS u (id) ORDER BY random() LIMIT p_cand_cap) x;
    RETURN QUERY SELECT * FROM queen.pop_list_prefix_v1(v_cands, p_group, p_worker, p_lease_seconds, p_auto_ack,
                                                 p_budget, p_max_partitions, p_intent_mode, p_intent_from);
END
$$;

-- The hot-list's reseed: every partition of the queue with pending data
-- for the group, leased or not (a leased one may expire and redeliver).
CREATE FUNCTION queen.hotlist_seed_v1(p_queue text, p_group text)
RETURNS TABLE (o_partition_id bigint, o_partition text)
LANGUAGE sql STABLE AS $$
    SELECT p.id, p.name FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
    WHERE q.name = p_queue AND (c.partition_id IS NULL OR p.last_offset > c.committed)
$$;

-- Reseeds many idle rings in one call: queen.hotlist_seed_v1's rule for
-- every (queue, group) pair, tagged with the pair's ordinal. Each ring (one
-- per queue and group a broker serves) is reseeded from SQL every
-- QUEEN_HOTLIST_RESEED_MS to learn what the broker cannot see itself
-- (another broker's pushes, retention, seeks); one query per ring was, with
-- 10,000 parked consumers, most of an idle broker's CPU.
CREATE FUNCTION queen.hotlist_seed_many_v1(p_queues text[], p_groups text[])
RETURNS TABLE (o_ring integer, o_partition_id bigint, o_partition text)
LANGUAGE sql STABLE AS $$
    SELECT r.ord::integer, p.id, p.name
    FROM unnest(p_queues, p_groups) WITH ORDINALITY AS r (queue, grp, ord)
    JOIN queen.queues q ON q.name = r.queue
    JOIN queen.partitions p ON p.queue_id = q.id
    LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = r.grp
    WHERE c.partition_id IS NULL OR p.last_offset > c.committed
$$;

-- A group's first contact with a queue, and the ring's first seed, in one
-- call: the broker's hot-list has one pop lead a (queue, group)'s first
-- contact while the group's other pops wait (pop::hotlist::Seeding), so
-- every one of them waits for this.
--
-- For the common case, a group starting at the beginning whose subscription
-- this call writes, the seed needs no cursor lookup: every cursor was just
-- written at -1, so the pending partitions are those holding a message. The
-- cursor rows go in without a conflict check (about a third of the insert),
-- which is safe only if none exists: a duplicate (a concurrent first contact
-- through another broker, or cursors left by single-partition pops) aborts
-- the block, and queen.register_group_v1's rules take over, as do groups
-- subscribed from 'now' or a timestamp.
CREATE FUNCTION queen.first_contact_v1(p_queue text, p_group text,
                                       p_intent_mode text, p_intent_from timestamptz)
RETURNS TABLE (o_partition_id bigint, o_partition text)
LANGUAGE plpgsql AS $$
DECLARE
    v_qid bigint := queen.ensure_queue_v1(p_queue);
BEGIN
    IF (p_group = '__QUEUE_MODE__' OR (p_intent_from IS NULL AND p_intent_mode IS DISTINCT FROM 'new'))
       AND NOT EXISTS (SELECT 1 FROM queen.subscriptions s WHERE s.queue_id = v_qid AND s.consumer_group = p_group) THEN
        BEGIN
            INSERT INTO queen.subscriptions (queue_id, consumer_group, subscription_mode)
            VALUES (v_qid, p_group, 'all');
            INSERT INTO queen.consumers (partition_id, consumer_group, committed)
            SELECT p.id, p_group, -1 FROM queen.partitions p WHERE p.queue_id = v_qid;
            RETURN QUERY SELECT p.id, p.name FROM queen.partitions p WHERE p.queue_id = v_qid AND p.last_offset > -1;
            RETURN;
        EXCEPTION WHEN unique_violation THEN
            NULL; -- rolled back to the block's start: the general rules below
        END;
    END IF;
    PERFORM queen.register_group_v1(v_qid, p_group, p_intent_mode, p_intent_from);
    RETURN QUERY SELECT s.o_partition_id, s.o_partition FROM queen.hotlist_seed_v1(p_queue, p_group) s;
END
$$;
