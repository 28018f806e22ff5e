-- Encryption at rest (issue 27): a dead letter of an encrypting queue keeps
-- its payload sealed, and the maxWaitTimeSeconds eviction dead-letters what
-- waited too long.
--
-- Invariants kept: PostgreSQL never holds the plaintext of an encrypted
-- payload, not in a segment and not in a dead letter's snapshot; eviction
-- moves a cursor only forward, only while no live lease holds the row, and
-- writes the dead letters and the cursor in one statement.

-- The envelope of a dead letter whose message was encrypted (payload is
-- NULL then): the broker opens it with the message id as it opens a frame.
ALTER TABLE queen.dead_letters ADD COLUMN sealed bytea;

-- queen.ack_v1 with p_dlq_sealed: the head's envelope when its frame was
-- encrypted (p_dlq_payload is then ignored). Every rule is ack_v1's,
-- described in 0004_ack.sql.
DROP FUNCTION queen.ack_v1(bigint, text, text, bigint[], text[], text[], bigint, uuid, text, uuid, text, text,
                           timestamptz, boolean);

CREATE FUNCTION queen.ack_v2(
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
    p_dlq_sealed       bytea,
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
                    transaction_id, trace_id, producer_sub, payload, sealed, error_message, retry_count, created_at)
                VALUES (v_qid, p_pid, p_group, v_head, p_dlq_message_id, p_dlq_txn, p_dlq_trace_id,
                        p_dlq_producer_sub, CASE WHEN p_dlq_sealed IS NULL THEN p_dlq_payload::jsonb END,
                        p_dlq_sealed, v_err, v_retries, p_dlq_created_at);
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

-- The maxWaitTimeSeconds eviction (src/maintenance/eviction.rs), in two
-- steps because only the broker can decode a segment.
--
-- Step one: cursor rows of queues with a limit whose next message lies in a
-- segment older than the limit and that hold no live lease, at most p_limit
-- of them. o_from is the first segment to read (the one covering
-- committed + 1, or the first after a retention gap) and o_cutoff the
-- creation time a segment must be older than. Segments are monotone in
-- created_at, so what is due is a prefix of the partition from the cursor.
CREATE FUNCTION queen.eviction_candidates_v1(p_limit integer)
RETURNS TABLE (o_partition_id bigint, o_group text, o_committed bigint, o_from bigint, o_cutoff timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT c.partition_id, c.consumer_group, c.committed, h.base_offset,
           now() - make_interval(secs => q.max_wait_time_seconds)
    FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    JOIN queen.consumers c ON c.partition_id = p.id
    CROSS JOIN LATERAL (
        (SELECT x.base_offset, x.created_at FROM (
             SELECT s.base_offset, s.end_offset, s.created_at FROM queen.segments s
             WHERE s.partition_id = p.id AND s.base_offset <= c.committed + 1
             ORDER BY s.base_offset DESC LIMIT 1) x
         WHERE x.end_offset > c.committed)
        UNION ALL
        (SELECT s.base_offset, s.created_at FROM queen.segments s
         WHERE s.partition_id = p.id AND s.base_offset > c.committed
         ORDER BY s.base_offset LIMIT 1)
        LIMIT 1) h
    WHERE q.max_wait_time_seconds > 0
      AND p.last_offset > c.committed
      AND (c.worker_id IS NULL OR c.lease_expires_at <= now())
      AND h.created_at < now() - make_interval(secs => q.max_wait_time_seconds)
    LIMIT p_limit
$$;

-- Step two: dead-letters the messages the broker decoded (parallel arrays,
-- in offset order, every offset above p_committed) for one (partition,
-- group) and moves its cursor past the last one, under the cursor row's
-- lock. Nothing happens (0 comes back) when the row moved on since step one
-- (another broker evicted, or a consumer acked), or when a live lease holds
-- it: eviction never passes a lease. The retry and attempt counters reset,
-- as for any move of the cursor to a new head message.
CREATE FUNCTION queen.evict_v1(
    p_pid          bigint,
    p_group        text,
    p_committed    bigint,
    p_offsets      bigint[],
    p_message_ids  uuid[],
    p_txns         text[],
    p_trace_ids    uuid[],
    p_subs         text[],
    p_payloads     text[],
    p_sealed       bytea[],
    p_created_at   timestamptz[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_qid   bigint;
    v_n     integer := COALESCE(cardinality(p_offsets), 0);
    v_last  bigint;
BEGIN
    IF v_n = 0 THEN
        RETURN 0;
    END IF;
    v_last := p_offsets[v_n];
    SELECT p.queue_id INTO v_qid
    FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id
    WHERE c.partition_id = p_pid AND c.consumer_group = p_group AND c.committed = p_committed
      AND (c.worker_id IS NULL OR c.lease_expires_at <= clock_timestamp())
    FOR UPDATE OF c;
    IF v_qid IS NULL THEN
        RETURN 0;
    END IF;
    INSERT INTO queen.dead_letters (queue_id, partition_id, consumer_group, msg_offset, message_id, transaction_id,
        trace_id, producer_sub, payload, sealed, error_message, retry_count, created_at)
    SELECT v_qid, p_pid, p_group, m.off, m.id, m.txn, m.trace, m.sub,
           CASE WHEN m.sealed IS NULL THEN m.payload::jsonb END, m.sealed, 'max_wait_time', 0, m.at
    FROM unnest(p_offsets, p_message_ids, p_txns, p_trace_ids, p_subs, p_payloads, p_sealed, p_created_at)
         AS m (off, id, txn, trace, sub, payload, sealed, at);
    UPDATE queen.consumers c SET
        committed = v_last,
        retry_count = 0,
        attempt_count = 0,
        attempt_offset = NULL,
        worker_id = NULL,
        lease_expires_at = NULL,
        lease_acquired_at = NULL,
        batch_end = NULL
    WHERE c.partition_id = p_pid AND c.consumer_group = p_group;
    RETURN v_n;
END
$$;
