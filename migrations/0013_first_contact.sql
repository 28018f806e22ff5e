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
-- a group that starts at the beginning, and the rows carry no foreign key.
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
-- seeding above (one locking lookup per row). Like the transaction index,
-- cursors are now removed explicitly with their partition.
ALTER TABLE queen.consumers DROP CONSTRAINT consumers_partition_id_fkey;

-- pop_wildcard_v1 with the subscription-only registration and the seeding
-- claim.
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

-- pop_discover_v1 with the subscription-only registration and the seeding
-- claim. Queues still register in id order.
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

-- cleanup_partitions_v1, removing the partitions' cursors explicitly now
-- that no foreign key cascades to them. (A broker still on v1 leaves them
-- behind: every reader joins the partition, and partition ids are never
-- reused, so such rows are inert.)
CREATE FUNCTION queen.cleanup_partitions_v2(p_idle interval, p_batch integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM queen.empty_partitions e
    USING queen.partitions p
    WHERE p.id = e.partition_id AND p.last_offset >= p.log_start;
    DELETE FROM queen.empty_partitions e
    WHERE NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = e.partition_id);
    WITH doomed AS (
        SELECT p.id FROM queen.empty_partitions e
        JOIN queen.partitions p ON p.id = e.partition_id
        WHERE p.last_write_at < now() - p_idle
        ORDER BY e.emptied_at
        LIMIT p_batch
        FOR UPDATE OF p SKIP LOCKED
    ), idx AS (
        DELETE FROM queen.txn_index t USING doomed d WHERE t.partition_id = d.id RETURNING 1
    ), cursors AS (
        DELETE FROM queen.consumers c USING doomed d WHERE c.partition_id = d.id RETURNING 1
    ), gone AS (
        DELETE FROM queen.partitions p USING doomed d WHERE p.id = d.id RETURNING p.id
    ), forgotten AS (
        DELETE FROM queen.empty_partitions e USING gone g WHERE e.partition_id = g.id RETURNING 1
    )
    SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END
$$;

-- delete_queue_v1, removing the queue's cursors explicitly (see above).
CREATE FUNCTION queen.delete_queue_v2(p_queue text)
RETURNS TABLE (o_existed boolean, o_partitions integer, o_messages bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_qid bigint;
BEGIN
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.name = p_queue FOR UPDATE;
    IF v_qid IS NULL THEN
        RETURN QUERY SELECT false, 0, 0::bigint;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, count(*)::integer, COALESCE(sum(p.last_offset + 1), 0)::bigint
                 FROM queen.partitions p WHERE p.queue_id = v_qid;
    DELETE FROM queen.txn_index t USING queen.partitions p WHERE p.id = t.partition_id AND p.queue_id = v_qid;
    DELETE FROM queen.consumers c USING queen.partitions p WHERE p.id = c.partition_id AND p.queue_id = v_qid;
    DELETE FROM queen.queues q WHERE q.id = v_qid;
END
$$;
