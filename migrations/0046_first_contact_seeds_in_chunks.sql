-- A group's first contact answers at once, whatever the queue's size (issue 51).
--
-- queen.first_contact_v1 (0033) registers a new group and, in the same
-- statement, writes its cursor on every partition of the queue and answers
-- every partition holding a message (the ring's first seed). At 1,000,000
-- partitions the insert took 7.8 s and the seed 1.6 s more, and every
-- consumer of the group waited for both: no message for the first 9.4 s of a
-- drain whose 10-partition baseline starts in 30 ms. The work grew with the
-- queue on a request's path.
--
-- Now the first contact covers the first p_seed_now partitions only, in
-- name order: their cursors, and those of them holding messages as the
-- ring's seed. The broker walks the rest in the background, a chunk per
-- statement (queen.seed_cursors_v1: the chunk's cursors, and its
-- partitions holding messages for the ring), ahead of the claims, which
-- take partitions in the order the seed gave them. Nothing depends on the
-- walk finishing: a claim that meets a partition without the group's
-- cursor writes that one itself under its try-lock (queen.pop_claim_v1), as
-- it always has for partitions created after the group registered; the
-- retention and gauge rules already read a missing cursor as "nothing
-- consumed"; and the ring's periodic reseed walks the whole queue. A broker
-- killed mid-way leaves the rest to those.
--
-- Only the fast path changes (a new group reading everything: every cursor
-- at -1). A group registered from a timestamp or from the end goes through
-- queen.register_group_v1 as before.
--
-- Both functions answer rows (o_partition_id, o_partition): the partitions
-- holding messages, in name order, and when partitions remain to walk, one
-- more row with o_partition_id NULL whose o_partition is the name after
-- which they remain.

CREATE FUNCTION queen.first_contact_v2(p_queue text, p_group text,
                                       p_intent_mode text, p_intent_from timestamptz,
                                       p_seed_now integer)
RETURNS TABLE (o_partition_id bigint, o_partition text)
LANGUAGE plpgsql AS $$
DECLARE
    v_qid  bigint := queen.ensure_queue_v1(p_queue);
    v_n    integer;
    v_last text;
BEGIN
    IF (p_group = '__QUEUE_MODE__' OR (p_intent_from IS NULL AND p_intent_mode IS DISTINCT FROM 'new'))
       AND NOT EXISTS (SELECT 1 FROM queen.subscriptions s WHERE s.queue_id = v_qid AND s.consumer_group = p_group) THEN
        BEGIN
            INSERT INTO queen.subscriptions (queue_id, consumer_group, subscription_mode)
            VALUES (v_qid, p_group, 'all');
            WITH first AS (
                SELECT p.id, p.name FROM queen.partitions p
                WHERE p.queue_id = v_qid ORDER BY p.name LIMIT GREATEST(p_seed_now, 1)
            ), made AS (
                INSERT INTO queen.consumers (partition_id, consumer_group, committed)
                SELECT f.id, p_group, -1 FROM first f
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM made)::integer, (SELECT f.name FROM first f ORDER BY f.name DESC LIMIT 1)
            INTO v_n, v_last;
            RETURN QUERY SELECT p.id, p.name FROM queen.partitions p
                         WHERE p.queue_id = v_qid AND p.name <= v_last AND p.last_offset >= p.log_start ORDER BY p.name;
            IF v_n >= GREATEST(p_seed_now, 1)
               AND EXISTS (SELECT 1 FROM queen.partitions p WHERE p.queue_id = v_qid AND p.name > v_last) THEN
                RETURN QUERY SELECT NULL::bigint, v_last;
            END IF;
            RETURN;
        EXCEPTION WHEN unique_violation THEN
            NULL; -- rolled back to the block's start: the general rules below
        END;
    END IF;
    PERFORM queen.register_group_v1(v_qid, p_group, p_intent_mode, p_intent_from);
    RETURN QUERY SELECT s.o_partition_id, s.o_partition FROM queen.hotlist_seed_v1(p_queue, p_group) s;
END
$$;

-- Writes the group's cursor, where it has none, on up to p_limit partitions
-- of the queue past p_after in name order, and answers those of them
-- holding messages, and the marker row when partitions remain past them.
-- No row at all: the walk reached the queue's end, or the group is no
-- longer subscribed. A chunk's partition whose cursor already existed
-- comes back too; a claim finds it empty if it is, as for any stale
-- candidate.
--
-- The value is queen.seed_cursor_v1's for a subscribed group (its
-- subscription's point), computed once. The subscription row is held
-- (FOR KEY SHARE) for the statement: a group deleted with its metadata
-- meanwhile deletes that row first (src/admin/groups.rs), so either it
-- waits for this chunk and its cursor delete sees the chunk, or this chunk
-- finds no subscription and writes nothing.
--
-- The chunk is first written as the first contact writes its own: a plain
-- insert, no probe per row. A cursor something else wrote first (a claim
-- that got there before the walk, a seek) makes that insert fail; the
-- chunk is then written again around the cursors that exist, which are
-- left as they are. With a probe and a speculative insert per row, the
-- chunks of 100,000 cursors written during a drain took 1.8 s of
-- PostgreSQL's time; written plainly, 0.7 s.
CREATE FUNCTION queen.seed_cursors_v1(p_queue text, p_group text, p_after text, p_limit integer)
RETURNS TABLE (o_partition_id bigint, o_partition text)
LANGUAGE plpgsql AS $$
DECLARE
    v_qid   bigint;
    v_ts    timestamptz;
    v_found boolean;
    v_last  text;
    v_seen  integer;
    v_limit integer := GREATEST(p_limit, 1);
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue;
    IF v_qid IS NULL THEN
        RETURN;
    END IF;
    SELECT true, s.subscription_timestamp INTO v_found, v_ts
    FROM queen.subscriptions s WHERE s.queue_id = v_qid AND s.consumer_group = p_group
    FOR KEY SHARE;
    IF v_found IS NULL THEN
        RETURN;
    END IF;
    BEGIN
        WITH chunk AS (
            SELECT p.id, p.name FROM queen.partitions p
            WHERE p.queue_id = v_qid AND p.name > p_after ORDER BY p.name LIMIT v_limit
        ), made AS (
            INSERT INTO queen.consumers (partition_id, consumer_group, committed)
            SELECT c.id, p_group, CASE WHEN v_ts IS NULL THEN -1 ELSE queen.offset_before_v1(c.id, v_ts) END
            FROM chunk c
        )
        SELECT (SELECT count(*) FROM chunk)::integer, (SELECT c.name FROM chunk c ORDER BY c.name DESC LIMIT 1)
        INTO v_seen, v_last;
    EXCEPTION WHEN unique_violation THEN
        WITH chunk AS (
            SELECT p.id, p.name FROM queen.partitions p
            WHERE p.queue_id = v_qid AND p.name > p_after ORDER BY p.name LIMIT v_limit
        ), made AS (
            INSERT INTO queen.consumers (partition_id, consumer_group, committed)
            SELECT c.id, p_group, CASE WHEN v_ts IS NULL THEN -1 ELSE queen.offset_before_v1(c.id, v_ts) END
            FROM chunk c
            WHERE NOT EXISTS (SELECT 1 FROM queen.consumers x WHERE x.partition_id = c.id AND x.consumer_group = p_group)
            ON CONFLICT DO NOTHING
        )
        SELECT (SELECT count(*) FROM chunk)::integer, (SELECT c.name FROM chunk c ORDER BY c.name DESC LIMIT 1)
        INTO v_seen, v_last;
    END;
    RETURN QUERY SELECT p.id, p.name FROM queen.partitions p
                 WHERE p.queue_id = v_qid AND p.name > p_after AND p.name <= v_last AND p.last_offset >= p.log_start
                 ORDER BY p.name;
    IF v_seen >= v_limit THEN
        RETURN QUERY SELECT NULL::bigint, v_last;
    END IF;
END
$$;
