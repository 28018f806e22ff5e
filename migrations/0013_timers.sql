-- Timers (issue 29 §3): a message scheduled for later under a key. A
-- timer that comes due becomes an ordinary message of its queue, written by
-- the fire service (src/timers/fire.rs) through the push path in the same
-- transaction that deletes the timer row: a crash before the commit leaves
-- the timer to fire again, a commit leaves no timer, and brokers firing at
-- once skip each other's locked rows. Exactly once.
--
-- payload is the message's JSON text (a zstd payload is unpacked when it is
-- scheduled); txn becomes the message's transactionId and message_id its
-- id, both known at schedule time.
CREATE TABLE queen.timers (
    queue         text NOT NULL,
    timer_key     text NOT NULL,
    partition     text NOT NULL,
    payload       text NOT NULL,
    txn           text NOT NULL,
    message_id    uuid NOT NULL,
    producer_sub  text,
    deliver_at    timestamptz NOT NULL,
    attempts      integer NOT NULL DEFAULT 0,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, timer_key)
);
CREATE INDEX timers_due ON queen.timers (deliver_at);

-- The verdict of a schedule, reschedule or cancel.
CREATE TYPE queen.timer_verdict AS (
    ok boolean, status text, txn text, message_id uuid, deliver_at timestamptz);

-- schedule and reschedule are one upsert keyed by (queue, timer_key): a new
-- key is 'scheduled'; the same key again with the same txn is a retry and
-- changes nothing ('scheduled'); another txn replaces the timer, attempts
-- back to 0 ('rescheduled'). A row locked by a fire in progress (or by a
-- concurrent call on the same key) answers 'too_late' instead of waiting.
CREATE FUNCTION queen.timer_schedule_v1(
    p_queue text, p_key text, p_partition text, p_payload text, p_txn text,
    p_message_id uuid, p_producer text, p_delay_ms bigint)
RETURNS queen.timer_verdict
LANGUAGE plpgsql AS $$
DECLARE
    r queen.timers;
    v_at timestamptz := now() + make_interval(secs => p_delay_ms / 1000.0);
BEGIN
    SELECT * INTO r FROM queen.timers t WHERE t.queue = p_queue AND t.timer_key = p_key FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        INSERT INTO queen.timers (queue, timer_key, partition, payload, txn, message_id, producer_sub, deliver_at)
        VALUES (p_queue, p_key, p_partition, p_payload, p_txn, p_message_id, p_producer, v_at)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN (true, 'scheduled', p_txn, p_message_id, v_at)::queen.timer_verdict;
        END IF;
        SELECT * INTO r FROM queen.timers t WHERE t.queue = p_queue AND t.timer_key = p_key;
        RETURN (false, 'too_late', r.txn, r.message_id, r.deliver_at)::queen.timer_verdict;
    END IF;
    IF r.txn = p_txn THEN
        RETURN (true, 'scheduled', r.txn, r.message_id, r.deliver_at)::queen.timer_verdict;
    END IF;
    UPDATE queen.timers t
    SET partition = p_partition, payload = p_payload, txn = p_txn, message_id = p_message_id,
        producer_sub = p_producer, deliver_at = v_at, attempts = 0, last_error = NULL, updated_at = now()
    WHERE t.queue = p_queue AND t.timer_key = p_key;
    RETURN (true, 'rescheduled', p_txn, p_message_id, v_at)::queen.timer_verdict;
END
$$;

-- cancel: 'cancelled', 'absent' (no pending timer under the key, or one with
-- another txn when p_txn is given: absent may mean already delivered), or
-- 'too_late' while a fire holds the row.
CREATE FUNCTION queen.timer_cancel_v1(p_queue text, p_key text, p_txn text)
RETURNS queen.timer_verdict
LANGUAGE plpgsql AS $$
DECLARE
    r queen.timers;
BEGIN
    SELECT * INTO r FROM queen.timers t WHERE t.queue = p_queue AND t.timer_key = p_key FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM queen.timers t WHERE t.queue = p_queue AND t.timer_key = p_key) THEN
            RETURN (false, 'too_late', p_txn, NULL, NULL)::queen.timer_verdict;
        END IF;
        RETURN (false, 'absent', p_txn, NULL, NULL)::queen.timer_verdict;
    END IF;
    IF p_txn IS NOT NULL AND r.txn <> p_txn THEN
        RETURN (false, 'absent', p_txn, NULL, NULL)::queen.timer_verdict;
    END IF;
    DELETE FROM queen.timers t WHERE t.queue = p_queue AND t.timer_key = p_key;
    RETURN (true, 'cancelled', r.txn, r.message_id, r.deliver_at)::queen.timer_verdict;
END
$$;
