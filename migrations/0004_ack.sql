-- The commit path (API.md §2.3, seeds/consuming.md "After the pop"): an ack
-- is an offset commit, so acking a message finishes everything before it in
-- that partition for that group. queen.ack_completed_many_v1 applies the
-- plain case of many (partition, lease) groups in one statement;
-- queen.ack_v1 applies every rule to one group; queen.ack_span_v1 hands the
-- broker the segments an ack may name when it cannot resolve a
-- transactionId otherwise; queen.lease_extend_v1 renews leases.
--
-- Invariants:
--   * fenced: an ack that names a lease commits only while that lease is the
--     cursor row's live lease; a released, expired or foreign lease moves
--     nothing;
--   * the cursor only moves forward, under the cursor row's lock;
--   * the retry budget (retry_count) belongs to the message just past the
--     cursor: every move of the cursor resets it, and only an explicit
--     failed ack charges it (a lease expiry never does);
--   * reaching batch_end releases the lease.

-- Applies the acks of one (partition, group, lease) group in one statement's
-- worth of work under the cursor row's lock. Items arrive with their offsets
-- already resolved by the broker (NULL = resolves nowhere) and their status
-- normalized to completed | failed | retry | dlq. The rules, in order:
--   * a named lease is live only when it is the row's worker_id and has not
--     expired; anything else (released by a nack, a full-batch ack or a
--     seek; expired; never issued) refuses every resolvable item with
--     'invalid or expired lease' and moves nothing. A leased ack on a
--     partition with no cursor row for its group (the group was deleted, or
--     never leased there) answers the same;
--   * unresolvable -> refused; at or below the cursor -> completed is a
--     harmless duplicate (noop), anything else is refused. With p_fenced
--     (transactions, API.md §2.4) the lease is checked first, so an ack of an
--     already committed message under a lease that is not live is refused
--     instead of answered as a no-op, and its bundle rolls back whole;
--   * items beyond the leased batch are refused;
--   * the head signal is the lowest failed/retry/dlq offset (ties: dlq >
--     failed > retry); the cursor advances to the highest completed offset
--     below it (implicit ack of everything under a completed offset);
--     completed acks above it do not count: those messages redeliver;
--   * retry: release the lease, budget untouched;
--   * failed: charge the retry budget and release; once the budget is
--     spent, dead-letter the head (or drop it when the queue keeps no DLQ)
--     and move the cursor past it;
--   * dlq: dead-letter the head at once;
--   * all completed: reaching batch_end releases the lease and resets the
--     counters.
-- The budget is charged (and a message dead-lettered) only when the head is
-- the next message after the cursor; a signal above unacknowledged messages
-- just releases the lease, and the span redelivers.
-- Dead-lettering needs the head message's snapshot, which only the broker can
-- decode: when p_dlq_offset does not name the head, nothing is changed and a
-- single row (o_index -1, o_error 'snapshot', o_committed = head offset) asks
-- the broker to call again with it.
CREATE FUNCTION queen.ack_v1(
    p_pid              bigint,
    p_group            text,
    p_lease            text,
    p_offsets          bigint[],
    p_statuses         text[],
    p_errors           text[],
    p_dlq_offset       bigint,
    p_dlq_message_id   uuid,
    p_dlq_txn          text,
    p_dlq_trace_id     uuid,
    p_dlq_producer_sub text,
    p_dlq_payload      text,
    p_dlq_created_at   timestamptz,
    p_fenced           boolean)
RETURNS TABLE (o_index integer, o_success boolean, o_error text, o_noop boolean, o_dlq boolean,
               o_lease_released boolean, o_committed bigint, o_queue text)
LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := clock_timestamp();
    v_n          integer := COALESCE(cardinality(p_offsets), 0);
    v_committed  bigint;
    v_worker     text;
    v_expires    timestamptz;
    v_batch_end  bigint;
    v_retries    integer;
    v_limit      integer;
    v_dlq_on     boolean;
    v_qid        bigint;
    v_queue      text;
    v_leased     boolean := p_lease IS NOT NULL AND p_lease <> '';
    v_lease_ok   boolean;
    v_verdict    text[] := array_fill(NULL::text, ARRAY[v_n]);
    v_head       bigint;
    v_head_rank  integer := 0;
    v_head_i     integer;
    v_clamp      bigint;
    v_new        bigint;
    v_release    boolean := false;
    v_reset      boolean := false;
    v_retries_before integer;
    v_dlq_done   boolean := false;
    v_err        text;
    i            integer;
    v_off        bigint;
    v_rank       integer;
BEGIN
    SELECT c.committed, c.worker_id, c.lease_expires_at, c.batch_end, c.retry_count,
           q.retry_limit, q.dead_letter_queue OR q.dlq_after_max_retries, q.id, q.name
    INTO v_committed, v_worker, v_expires, v_batch_end, v_retries, v_limit, v_dlq_on, v_qid, v_queue
    FROM queen.consumers c
    JOIN queen.partitions p ON p.id = c.partition_id
    JOIN queen.queues q ON q.id = p.queue_id
    WHERE c.partition_id = p_pid AND c.consumer_group = p_group
    FOR UPDATE OF c;
    IF v_qid IS NULL THEN
        FOR i IN 1..v_n LOOP
            RETURN QUERY SELECT i - 1, false,
                CASE WHEN p_offsets[i] IS NULL
                     THEN 'unresolvable: transaction not in the ack window (hash purged or never pushed); if leased, the message redelivers'
                     WHEN v_leased THEN 'invalid or expired lease' -- the group was deleted, or never leased here
                     ELSE 'no cursor: this consumer group has not consumed from this partition' END,
                false, false, false, NULL::bigint, NULL::text;
        END LOOP;
        RETURN;
    END IF;
    -- COALESCE: a released lease leaves worker_id NULL, and NULL = p_lease
    -- is NULL, not false, and the refusal would never fire.
    v_lease_ok := NOT v_leased OR COALESCE(v_worker = p_lease AND v_expires > v_now, false);

    -- Classify every item; find the head signal and the clamp.
    FOR i IN 1..v_n LOOP
        v_off := p_offsets[i];
        IF v_off IS NULL THEN
            v_verdict[i] := 'unresolvable';
        ELSIF p_fenced AND NOT v_lease_ok THEN
            v_verdict[i] := 'lease'; -- a transaction's ack proves its lease, even below the cursor
        ELSIF v_off <= v_committed THEN
            v_verdict[i] := CASE WHEN p_statuses[i] = 'completed' THEN 'noop' ELSE 'behind' END;
        ELSIF NOT v_lease_ok THEN
            v_verdict[i] := 'lease';
        ELSIF v_leased AND v_off > v_batch_end THEN
            v_verdict[i] := 'outside';
        ELSE
            v_verdict[i] := 'live';
            v_rank := CASE p_statuses[i] WHEN 'dlq' THEN 3 WHEN 'failed' THEN 2 WHEN 'retry' THEN 1 ELSE 0 END;
            IF v_rank > 0 AND (v_head IS NULL OR v_off < v_head OR (v_off = v_head AND v_rank > v_head_rank)) THEN
                v_head := v_off; v_head_rank := v_rank; v_head_i := i;
            END IF;
        END IF;
    END LOOP;
    FOR i IN 1..v_n LOOP
        IF v_verdict[i] = 'live' AND p_statuses[i] = 'completed' AND (v_head IS NULL OR p_offsets[i] < v_head) THEN
            v_clamp := GREATEST(v_clamp, p_offsets[i]);
        END IF;
    END LOOP;
    v_new := GREATEST(v_committed, v_clamp);
    v_retries_before := v_retries;
    IF v_new <> v_committed THEN
        v_retries := 0; -- a new head message starts with a fresh budget
    END IF;

    IF v_head IS NOT NULL THEN
        v_release := true;
        IF v_head = v_new + 1 AND (v_head_rank = 3 OR (v_head_rank = 2 AND v_retries >= v_limit)) THEN
            IF v_dlq_on OR v_head_rank = 3 THEN
                IF p_dlq_offset IS DISTINCT FROM v_head THEN
                    RETURN QUERY SELECT -1, false, 'snapshot'::text, false, false, false, v_head, v_queue;
                    RETURN;
                END IF;
                v_err := COALESCE(NULLIF(p_errors[v_head_i], ''),
                                  CASE WHEN v_head_rank = 3 THEN 'Dead-lettered by the consumer' ELSE 'Retries exhausted' END);
                INSERT INTO queen.dead_letters (queue_id, partition_id, consumer_group, msg_offset, message_id,
                    transaction_id, trace_id, producer_sub, payload, error_message, retry_count, created_at)
                VALUES (v_qid, p_pid, p_group, v_head, p_dlq_message_id, p_dlq_txn, p_dlq_trace_id,
                        p_dlq_producer_sub, p_dlq_payload::jsonb, v_err, v_retries, p_dlq_created_at);
                v_dlq_done := true;
            END IF;
            v_new := v_head; -- past the dead-lettered (or dropped) message
            v_retries := 0;
            v_reset := true;
        ELSIF v_head = v_new + 1 AND v_head_rank = 2 THEN
            v_retries := v_retries + 1;
        END IF;
    ELSIF v_worker IS NOT NULL AND v_new > v_committed AND v_new >= COALESCE(v_batch_end, v_new) THEN
        v_release := true; -- the whole leased batch is committed
        v_reset := true;
    END IF;

    IF v_new <> v_committed OR v_release OR v_retries <> v_retries_before THEN
        UPDATE queen.consumers c SET
            committed = v_new,
            total_consumed = c.total_consumed + (v_new - v_committed),
            last_consumed_at = CASE WHEN v_new > v_committed THEN v_now ELSE c.last_consumed_at END,
            retry_count = v_retries,
            worker_id = CASE WHEN v_release THEN NULL ELSE c.worker_id END,
            lease_expires_at = CASE WHEN v_release THEN NULL ELSE c.lease_expires_at END,
            lease_acquired_at = CASE WHEN v_release THEN NULL ELSE c.lease_acquired_at END,
            batch_end = CASE WHEN v_release THEN NULL ELSE c.batch_end END,
            attempt_count = CASE WHEN v_reset THEN 0 ELSE c.attempt_count END,
            attempt_offset = CASE WHEN v_reset THEN NULL ELSE c.attempt_offset END
        WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
    END IF;

    FOR i IN 1..v_n LOOP
        o_index := i - 1; o_noop := false; o_dlq := false; o_lease_released := false; o_committed := v_new;
        o_queue := v_queue;
        CASE v_verdict[i]
            WHEN 'unresolvable' THEN
                o_success := false;
                o_error := 'unresolvable: transaction not in the ack window (hash purged or never pushed); if leased, the message redelivers';
            WHEN 'noop' THEN
                o_success := true; o_error := NULL; o_noop := true;
            WHEN 'behind' THEN
                o_success := false;
                o_error := 'already committed: the cursor moved past this message before this ack';
            WHEN 'lease' THEN
                o_success := false; o_error := 'invalid or expired lease';
            WHEN 'outside' THEN
                o_success := false; o_error := 'not in the leased batch';
            ELSE
                o_lease_released := v_release;
                IF p_statuses[i] = 'completed' AND v_head IS NOT NULL AND p_offsets[i] > v_head THEN
                    o_success := false;
                    o_error := 'not committed: a lower message of this batch was nacked; this one redelivers';
                ELSE
                    o_success := true; o_error := NULL;
                    o_dlq := v_dlq_done AND i = v_head_i;
                END IF;
        END CASE;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The common ack of a multi-partition batch in one statement: the plain
-- case of many (partition, lease) groups, where every item is completed, the
-- group's lease is live and every offset lies inside the leased span
-- (committed, batch_end]. queen.ack_v1's rules for exactly that case: the
-- cursor moves to the highest offset, the retry counter resets, and reaching
-- batch_end releases the lease and resets the attempt counters. Returns the
-- ordinals of the groups it applied, with whether the lease was released and
-- the queue's name; a group it does not return was left untouched and goes
-- through queen.ack_v1, which answers everything else. ack_v1 per group
-- cost ~70 µs of PostgreSQL, most of a 10-message-per-partition commit path.
--
-- Arguments, parallel, one entry per group (each (partition, lease) is one
-- group): p_pids, p_leases, the lowest and highest offset the group
-- acknowledges, and p_queues, the queue's name where the broker knows it
-- (the ack registry remembers the queue of each leased batch it handed out);
-- only a NULL entry is looked up, through the partition row.
--
-- There is no separate lock pass: the update is driven by the arrays in the
-- order given (an index probe per element, the generic plan pinned), and
-- the broker sends them in partition order, so the cursor rows are locked in
-- partition order by the update itself. Should a plan ever lock in another
-- order, a deadlock aborts one transaction, which the broker retries
-- (ack::DEADLOCK_ATTEMPTS).
CREATE FUNCTION queen.ack_completed_many_v1(
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

ALTER FUNCTION queen.ack_completed_many_v1(text, bigint[], text[], bigint[], bigint[], text[])
    SET plan_cache_mode = force_generic_plan;

-- The segments an ack may name when neither the broker's registry (another
-- broker popped the batch, a restart, an eviction) nor the index (a window-0
-- queue, or a hash purged while leased) knows its transactionId: those
-- overlapping [committed + 1 - p_slack, hi], hi being the group's batch_end or
-- committed + p_slack, whichever is higher, so the leased batch, a lease-less
-- ack just past the cursor and a retried ack just below it all resolve.
-- Bounded by the slack and the batch, never by the log.
CREATE FUNCTION queen.ack_span_v1(p_partition_id bigint, p_group text, p_slack integer)
RETURNS TABLE (o_base_offset bigint, o_blob bytea)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_committed  bigint;
    v_batch_end  bigint;
    v_lo         bigint;
    v_hi         bigint;
BEGIN
    SELECT c.committed, c.batch_end INTO v_committed, v_batch_end
    FROM queen.consumers c WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group;
    v_committed := COALESCE(v_committed, -1);
    v_lo := v_committed + 1 - p_slack;
    v_hi := GREATEST(COALESCE(v_batch_end, -1), v_committed + p_slack);
    -- Start at the segment covering v_lo (a backward key step), not at the
    -- partition's first segment.
    v_lo := COALESCE((SELECT s.base_offset FROM queen.segments s
                      WHERE s.partition_id = p_partition_id AND s.base_offset <= v_lo
                      ORDER BY s.base_offset DESC LIMIT 1), v_lo);
    RETURN QUERY
    SELECT s.base_offset, s.blob FROM queen.segments s
    WHERE s.partition_id = p_partition_id AND s.base_offset BETWEEN v_lo AND v_hi
    ORDER BY s.base_offset;
END
$$;

-- Renews every live lease held by p_lease (all partitions of a multi-
-- partition pop). Never shortens (GREATEST), never revives (only leases still
-- live). p_pids narrows the search to the partitions the broker knows the
-- lease covers; NULL searches every cursor (worker_id is deliberately not
-- indexed: the claim and the commit update it).
CREATE FUNCTION queen.lease_extend_v1(p_lease text, p_seconds integer, p_pids bigint[])
RETURNS TABLE (o_renewed integer, o_expires_at timestamptz)
LANGUAGE sql AS $$
    WITH renewed AS (
        UPDATE queen.consumers c
        SET lease_expires_at = GREATEST(c.lease_expires_at, clock_timestamp() + make_interval(secs => p_seconds))
        WHERE (p_pids IS NULL OR c.partition_id = ANY (p_pids))
          AND c.worker_id = p_lease AND c.lease_expires_at > clock_timestamp()
        RETURNING c.lease_expires_at)
    SELECT count(*)::integer, min(lease_expires_at) FROM renewed
$$;
