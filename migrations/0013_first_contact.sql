-- First contact of a group with a queue, at a third of the cost.
--
-- The first pop of a (queue, group) on the wildcard or discovery path seeds
-- one cursor row per partition in one statement while every other consumer
-- of the group waits on its uncommitted subscription row. At 100,000
-- partitions register_group_v1 took 1.0-1.2 s of that: per row a call of
-- seed_cursor_v1 (a quarter), a foreign-key lookup of the partition (a
-- third), the index entry and the conflict check. Measured on 100,000
-- partitions: v1 1.02 s, v2 0.36 s.
--
-- Creating cursors lazily instead, each in the claim that first needs it,
-- was measured too and lost: 50 cursors inserted by a pop cost 1.2 ms (one
-- index descent and conflict check each, in random order), and the claim
-- that updates rows made in its own transaction 0.8 ms more, so a
-- 100,000-partition drain took 8.6 s instead of 7.6.

-- First contact of (queue, group): the subscription record, then one
-- cursor per partition in one statement (the first insertion elects the one
-- seeder; concurrent first contacts wait for it). Returns whether this call
-- was the seeder. Unlike seed_cursor_v1 per row, the seed is a constant for
-- a group that starts at the beginning.
CREATE FUNCTION queen.register_group_v2(p_qid bigint, p_group text,
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

-- The cursor rows' foreign key to their partition cost a third of the
-- seeding above (one locking lookup of the partition per row). What it did
-- besides checking, removing a partition's cursors with the partition, a
-- trigger does now, once per deleting statement: retention's partition
-- cleanup and a queue's deletion (whose cascade deletes its partitions)
-- take their cursors along as before.
ALTER TABLE queen.consumers DROP CONSTRAINT consumers_partition_id_fkey;

CREATE FUNCTION queen.drop_cursors_v1()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queen.consumers c USING gone g WHERE c.partition_id = g.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER partitions_drop_cursors
AFTER DELETE ON queen.partitions
REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION queen.drop_cursors_v1();

-- pop_wildcard_v1, registering through register_group_v2 and claiming
-- through pop_list_v3 (the hot-list's claim; same rows as pop_list_v1).
CREATE FUNCTION queen.pop_wildcard_v2(
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
    PERFORM queen.register_group_v2(v_qid, p_group, p_intent_mode, p_intent_from);
    FOR r IN SELECT * FROM queen.pop_list_v3(queen.pop_candidates_v1(v_qid, p_group, p_cand_cap),
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

-- pop_discover_v1, registering through register_group_v2 and claiming
-- through pop_list_v3. Queues still register in id order.
CREATE FUNCTION queen.pop_discover_v2(
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
        PERFORM queen.register_group_v2(v_qid, p_group, p_intent_mode, p_intent_from);
        v_cands := v_cands || queen.pop_candidates_v1(v_qid, p_group, p_cand_cap);
    END LOOP;
    SELECT COALESCE(array_agg(x.id), '{}') INTO v_cands
    FROM (SELECT u.id FROM unnest(v_cands) AS u (id) ORDER BY random() LIMIT p_cand_cap) x;
    RETURN QUERY SELECT * FROM queen.pop_list_v3(v_cands, p_group, p_worker, p_lease_seconds, p_auto_ack,
                                                 p_budget, p_max_partitions, p_intent_mode, p_intent_from);
END
$$;
