-- The pop path (seeds/life-of-a-pop.md): subscription seeding, the claim of
-- one partition, the list loop every route funnels into, the SQL candidate
-- scan with its first-contact bulk seed and empty-scan watermark, and the
-- queries behind the broker's hot-list.
--
-- No statement here waits on another transaction's row: the claim is
-- FOR UPDATE SKIP LOCKED, a missing cursor row is created only under a
-- *try* advisory lock, so a wildcard pop whose transaction spans its whole
-- candidate loop never joins a wait chain.

-- Per (queue, group) bookkeeping of the SQL candidate path: partitions not
-- written since watermark - 2 minutes are not candidates; checked_at
-- throttles the lease-blind re-check that may advance it.
CREATE TABLE queen.scan_watermarks (
    queue_id        bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    consumer_group  text NOT NULL,
    watermark       timestamptz NOT NULL DEFAULT '-infinity',
    checked_at      timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (queue_id, consumer_group)
) WITH (fillfactor = 50, vacuum_truncate = off);

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
CREATE FUNCTION queen.pop_claim_v1(
    p_pid            bigint,
    p_group          text,
    p_worker         text,
    p_lease_seconds  integer,      -- NULL or <= 0: the queue's leaseTime
    p_auto_ack       boolean,
    p_budget         integer,
    p_intent_mode    text,
    p_intent_from    timestamptz)
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
    IF v_window > 0 AND v_last_write > v_now - make_interval(secs => v_window) THEN
        o_kind := 'deferred'; RETURN NEXT; RETURN;
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
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_auto_ack THEN
        -- At-most-once: committed inside the pop, no lease.
        UPDATE queen.consumers c SET
            committed = v_end, worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL,
            batch_end = NULL, total_consumed = c.total_consumed + (v_end - v_first + 1),
            last_consumed_at = v_now
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

-- One row of a pop: pop_claim_v1's row, with the partition and queue it
-- belongs to. Every route returns this shape.
CREATE TYPE queen.pop_row AS (
    o_partition_id bigint, o_partition text, o_queue text, o_kind text,
    o_base_offset bigint, o_start_idx integer, o_take integer, o_created_at timestamptz,
    o_blob bytea, o_first bigint, o_last bigint, o_attempt integer, o_msg_count integer);

-- The loop every route funnels into: claims the candidates in the given
-- order until the budget is spent or p_max_partitions (0 = no cap) have
-- been claimed. Candidates after the stop return nothing (unvisited).
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
    v_pid      bigint;
    v_left     integer := p_budget;
    v_claimed  integer := 0;
    v_name     text;
    v_queue    text;
    r          record;
    v_row      queen.pop_row;
BEGIN
    FOREACH v_pid IN ARRAY COALESCE(p_pids, '{}') LOOP
        EXIT WHEN v_left <= 0 OR (p_max_partitions > 0 AND v_claimed >= p_max_partitions);
        SELECT p.name, q.name INTO v_name, v_queue
        FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE p.id = v_pid;
        FOR r IN SELECT * FROM queen.pop_claim_v1(v_pid, p_group, p_worker, p_lease_seconds, p_auto_ack,
                                                   v_left, p_intent_mode, p_intent_from) LOOP
            v_row := (v_pid, v_name, v_queue, r.o_kind, r.o_base_offset, r.o_start_idx, r.o_take,
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

-- First contact of (queue, group) on the wildcard and discovery paths: the
-- first insertion of the subscription record elects the one seeder, which
-- seeds every partition's cursor in one set-based statement (lazy per-
-- partition creation by many concurrent pops would convoy). Returns whether
-- this call was the seeder.
CREATE FUNCTION queen.register_group_v1(p_qid bigint, p_group text,
                                        p_intent_mode text, p_intent_from timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_rows integer;
BEGIN
    PERFORM 1 FROM queen.subscriptions s WHERE s.queue_id = p_qid AND s.consumer_group = p_group;
    IF FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO queen.subscriptions (queue_id, consumer_group, subscription_mode, subscription_timestamp)
    VALUES (p_qid, p_group,
            CASE WHEN p_group = '__QUEUE_MODE__' THEN 'all'
                 WHEN p_intent_from IS NOT NULL THEN 'timestamp'
                 WHEN p_intent_mode = 'new' THEN 'new' ELSE 'all' END,
            CASE WHEN p_group = '__QUEUE_MODE__' THEN NULL
                 WHEN p_intent_from IS NOT NULL THEN p_intent_from
                 WHEN p_intent_mode = 'new' THEN now() ELSE NULL END)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows = 0 THEN
        RETURN false;
    END IF;
    INSERT INTO queen.consumers (partition_id, consumer_group, committed)
    SELECT p.id, p_group, queen.seed_cursor_v1(p.id, p_qid, p_group, p_intent_mode, p_intent_from)
    FROM queen.partitions p WHERE p.queue_id = p_qid
    ON CONFLICT DO NOTHING;
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

-- The SQL path of a queue-scoped wildcard pop (also the first pop of a
-- (queue, group) when the hot-list is on): provisions the queue row (a group
-- may subscribe before the first push), registers the group, scans for
-- candidates, claims, and notes an empty scan.
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
    FOR r IN SELECT * FROM queen.pop_list_v1(queen.pop_candidates_v1(v_qid, p_group, p_cand_cap),
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

-- The discovery path: the same as the wildcard path over every queue whose
-- labels match (NULL = any). Queues register in id order, so two discovery
-- pops electing seeders on overlapping queues cannot wait on each other in
-- a cycle.
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
    -- Spread consumers across queues too, then cap the whole list.
    SELECT COALESCE(array_agg(x.id), '{}') INTO v_cands
    FROM (SELECT u.id FROM unnest(v_cands) AS u (id) ORDER BY random() LIMIT p_cand_cap) x;
    RETURN QUERY SELECT * FROM queen.pop_list_v1(v_cands, p_group, p_worker, p_lease_seconds, p_auto_ack,
                                                 p_budget, p_max_partitions, p_intent_mode, p_intent_from);
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
    RETURN QUERY SELECT * FROM queen.pop_list_v1(ARRAY[v_pid], p_group, p_worker, p_lease_seconds, p_auto_ack,
                                                 p_budget, 1, p_intent_mode, p_intent_from);
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
