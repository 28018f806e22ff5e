-- A group's first contact with a queue, and the ring's first seed, in one
-- call.
--
-- The broker's hot-list has one pop lead a (queue, group)'s first contact
-- while the group's other pops wait (pop::hotlist::Seeding). The leader
-- registered the group (register_group_v2: at 100,000 partitions 0.32 s,
-- one cursor row per partition) and then read the ring's seed
-- (hotlist_seed_v1: 0.13 s, a cursor lookup per partition), and every other
-- consumer waited for both.
--
-- For the common case, a group starting at the beginning whose subscription
-- this call writes, the seed needs no cursor lookup: every cursor was just
-- written at -1, so the pending partitions are those holding a message. The
-- cursor rows go in without a conflict check (about a third of the insert),
-- which is safe only if none exists: a duplicate (a concurrent first contact
-- through another broker, or cursors left by single-partition pops) aborts
-- the block, and register_group_v2's rules take over, as do groups
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
    PERFORM queen.register_group_v2(v_qid, p_group, p_intent_mode, p_intent_from);
    RETURN QUERY SELECT s.o_partition_id, s.o_partition FROM queen.hotlist_seed_v1(p_queue, p_group) s;
END
$$;
