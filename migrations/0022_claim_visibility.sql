-- The claim tells when a deferred partition becomes visible, and can leave
-- the windowBuffer hold to the broker (issue 35 §1, the revisit wheel).
--
-- pop_claim_v2 is pop_claim_v1 (migrations 0003, 0020) with two changes:
--   * a 'deferred' row carries in o_created_at the moment its partition's
--     head becomes claimable: the newest write + windowBuffer for the
--     quiet-period debounce, the first hidden segment's created_at +
--     delayedProcessing for a delay. The broker's revisit wheel opens the
--     queue's wake gate then, instead of leaving parked pops to their backoff;
--   * p_skip_window: the hot-list path times the windowBuffer hold in the
--     broker (ending at the window or when the waiting batch is full) and
--     then claims with the SQL debounce skipped. Every other caller passes
--     false: the debounce stays the safe floor wherever the broker does not
--     hold the partition itself. delayedProcessing is never skipped.
-- pop_claim_v1 keeps its signature for its callers (pop_list_v1, pop_list_v2)
-- and now answers through pop_claim_v2: one home for the claim.

CREATE FUNCTION queen.pop_claim_v2(
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

CREATE OR REPLACE FUNCTION queen.pop_claim_v1(
    p_pid            bigint,
    p_group          text,
    p_worker         text,
    p_lease_seconds  integer,
    p_auto_ack       boolean,
    p_budget         integer,
    p_intent_mode    text,
    p_intent_from    timestamptz)
RETURNS TABLE (o_kind text, o_base_offset bigint, o_start_idx integer, o_take integer,
               o_created_at timestamptz, o_blob bytea, o_first bigint, o_last bigint, o_attempt integer,
               o_msg_count integer)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM queen.pop_claim_v2(p_pid, p_group, p_worker, p_lease_seconds, p_auto_ack,
                                                  p_budget, p_intent_mode, p_intent_from, false);
END
$$;
