-- "Pending" means a message is there to read (issue 51).
--
-- The candidate rings' rule for a partition with pending data for a group
-- was "no cursor yet, or its last offset past the cursor". After retention
-- has emptied a partition (log_start past last_offset), a cursor behind the
-- removed messages still passed: a group's first contact with a queue of
-- 1,000,000 partitions that retention had emptied seeded its ring with all
-- of them, and long-polls then claimed their way through a million empty
-- candidates, four at a time, before reaching the partitions new messages
-- went to (476 of 15,000 one-message pushes delivered in 15 s, p50 2.8 s).
--
-- Now a partition is pending when it holds a message (last_offset >=
-- log_start) and, with a cursor, its last offset is past the cursor: then
-- the last message itself is one the group has not read. The same rule in
-- each place that said it: the ring's seed (queen.hotlist_seed_v1, which a
-- first contact under the general rules reads), its windowed reseed
-- (queen.hotlist_seed_window_v1), a first contact's fast path
-- (queen.first_contact_v1) and the long-poll's pending check
-- (queen.has_pending_v1). queen.hotlist_seed_many_v1 is the previous broker
-- version's and stays as it was.

CREATE OR REPLACE FUNCTION queen.hotlist_seed_v1(p_queue text, p_group text)
RETURNS TABLE (o_partition_id bigint, o_partition text)
LANGUAGE sql STABLE AS $$
    SELECT p.id, p.name FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
    WHERE q.name = p_queue AND p.last_offset >= p.log_start
      AND (c.partition_id IS NULL OR p.last_offset > c.committed)
$$;

CREATE OR REPLACE FUNCTION queen.hotlist_seed_window_v1(p_queues text[], p_groups text[], p_after text[], p_limit integer)
RETURNS TABLE (o_ring integer, o_edge text, o_seen integer, o_pending boolean, o_partition_id bigint, o_partition text)
LANGUAGE sql STABLE AS $$
    SELECT x.ord, x.edge, x.seen, x.pending, x.id, x.name
    FROM (
        SELECT r.ord::integer AS ord, w.id, w.name,
               w.last_offset >= w.log_start AND (c.partition_id IS NULL OR w.last_offset > c.committed) AS pending,
               max(w.name) OVER (PARTITION BY r.ord) AS edge,
               (count(*) OVER (PARTITION BY r.ord))::integer AS seen,
               row_number() OVER (PARTITION BY r.ord) AS rn
        FROM unnest(p_queues, p_groups, p_after) WITH ORDINALITY AS r (queue, grp, after, ord)
        JOIN queen.queues q ON q.name = r.queue
        CROSS JOIN LATERAL (
            SELECT p.id, p.name, p.last_offset, p.log_start FROM queen.partitions p
            WHERE p.queue_id = q.id AND p.name > r.after
            ORDER BY p.name
            LIMIT p_limit) w
        LEFT JOIN queen.consumers c ON c.partition_id = w.id AND c.consumer_group = r.grp
    ) x
    WHERE x.pending OR x.rn = 1
$$;

CREATE OR REPLACE FUNCTION queen.has_pending_v1(p_qid bigint, p_group text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM queen.partitions p
        LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
        WHERE p.queue_id = p_qid
          AND p.last_write_at >= COALESCE(
                (SELECT w.watermark FROM queen.scan_watermarks w
                 WHERE w.queue_id = p_qid AND w.consumer_group = p_group), '-infinity') - interval '2 minutes'
          AND p.last_offset >= p.log_start
          AND (c.partition_id IS NULL OR p.last_offset > c.committed))
$$;

CREATE OR REPLACE FUNCTION queen.first_contact_v1(p_queue text, p_group text,
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
            RETURN QUERY SELECT p.id, p.name FROM queen.partitions p WHERE p.queue_id = v_qid AND p.last_offset >= p.log_start;
            RETURN;
        EXCEPTION WHEN unique_violation THEN
            NULL; -- rolled back to the block's start: the general rules below
        END;
    END IF;
    PERFORM queen.register_group_v1(v_qid, p_group, p_intent_mode, p_intent_from);
    RETURN QUERY SELECT s.o_partition_id, s.o_partition FROM queen.hotlist_seed_v1(p_queue, p_group) s;
END
$$;
