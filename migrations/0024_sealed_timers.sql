-- Timers of encrypting queues keep their payloads sealed (issue 45): until
-- it fires, such a timer's payload is an AES-256-GCM envelope in `sealed`
-- (bound to the timer's message id, as a stored frame's is), and `payload`
-- is empty. The fire service opens it and pushes it through the push path,
-- which seals it again for the queue.
--
-- A broker of the previous version reads `payload` and would fire a sealed
-- timer as an empty message. So a sealed timer's `deliver_at` is the far
-- future, where no old broker looks, and its real due time is
-- `sealed_due_at`, which only brokers that open sealed timers read. During
-- a rolling upgrade an old broker leaves sealed timers alone.
ALTER TABLE queen.timers ADD COLUMN sealed bytea, ADD COLUMN sealed_due_at timestamptz;
CREATE INDEX timers_sealed_due ON queen.timers (sealed_due_at) WHERE sealed_due_at IS NOT NULL;

-- schedule, as timer_schedule_v1 (0013), with the payload sealed or not:
-- p_sealed NULL writes `payload` as before; otherwise `payload` is empty,
-- `sealed` holds the envelope and the due time goes to `sealed_due_at`.
-- The verdict's deliverAt is the real due time either way.
CREATE FUNCTION queen.timer_schedule_v2(
    p_queue text, p_key text, p_partition text, p_payload text, p_sealed bytea, p_txn text,
    p_message_id uuid, p_producer text, p_delay_ms bigint)
RETURNS queen.timer_verdict
LANGUAGE plpgsql AS $$
DECLARE
    r queen.timers;
    v_at timestamptz := now() + make_interval(secs => p_delay_ms / 1000.0);
    v_deliver timestamptz := CASE WHEN p_sealed IS NULL THEN v_at ELSE timestamptz '9999-12-31 00:00:00+00' END;
    v_sealed_due timestamptz := CASE WHEN p_sealed IS NULL THEN NULL ELSE v_at END;
    v_payload text := CASE WHEN p_sealed IS NULL THEN p_payload ELSE '' END;
BEGIN
    SELECT * INTO r FROM queen.timers t WHERE t.queue = p_queue AND t.timer_key = p_key FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        INSERT INTO queen.timers (queue, timer_key, partition, payload, sealed, txn, message_id, producer_sub, deliver_at, sealed_due_at)
        VALUES (p_queue, p_key, p_partition, v_payload, p_sealed, p_txn, p_message_id, p_producer, v_deliver, v_sealed_due)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN (true, 'scheduled', p_txn, p_message_id, v_at)::queen.timer_verdict;
        END IF;
        SELECT * INTO r FROM queen.timers t WHERE t.queue = p_queue AND t.timer_key = p_key;
        RETURN (false, 'too_late', r.txn, r.message_id, COALESCE(r.sealed_due_at, r.deliver_at))::queen.timer_verdict;
    END IF;
    IF r.txn = p_txn THEN
        RETURN (true, 'scheduled', r.txn, r.message_id, COALESCE(r.sealed_due_at, r.deliver_at))::queen.timer_verdict;
    END IF;
    UPDATE queen.timers t
    SET partition = p_partition, payload = v_payload, sealed = p_sealed, txn = p_txn, message_id = p_message_id,
        producer_sub = p_producer, deliver_at = v_deliver, sealed_due_at = v_sealed_due,
        attempts = 0, last_error = NULL, updated_at = now()
    WHERE t.queue = p_queue AND t.timer_key = p_key;
    RETURN (true, 'rescheduled', p_txn, p_message_id, v_at)::queen.timer_verdict;
END
$$;
