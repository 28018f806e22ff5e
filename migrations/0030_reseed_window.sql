-- A ring's reseed reads a window of its queue, not the whole queue (issue 51).
--
-- A candidate ring (src/pop/hotlist.rs) is reseeded from SQL every
-- QUEEN_HOTLIST_RESEED_MS to learn what the broker cannot see itself
-- (another broker's pushes without peer hints, seeks, retention). The
-- reseed read every partition of the queue and the group's cursor of each:
-- 2.9 s of PostgreSQL per reseed at 1,000,000 partitions, on the pop that
-- happened to be due (it held a claim slot and a connection meanwhile).
--
-- queen.hotlist_seed_window_v1 reads, for each ring, the next p_limit
-- partitions of its queue in name order past p_after[r] (the (queue_id,
-- name) index, in order), and answers those with pending data for the
-- group, as queen.hotlist_seed_v1's rule says (no cursor yet, or messages
-- past it), plus one row per ring, pending or not, that carries the
-- window's last name (o_edge) and size (o_seen): the broker starts the
-- ring's next reseed past o_edge, or from the first partition when the
-- window was not full. A ring whose queue has nothing past p_after[r]
-- answers no row (start over). The ring's knowledge only grows at a reseed,
-- so a window at a time loses nothing: each partition is looked at once a
-- walk.
--
-- queen.hotlist_seed_many_v1 stays for the previous broker version during
-- a rolling upgrade; queen.hotlist_seed_v1 stays for queen.first_contact_v1
-- (a group's first seed reads the whole queue once).
CREATE FUNCTION queen.hotlist_seed_window_v1(p_queues text[], p_groups text[], p_after text[], p_limit integer)
RETURNS TABLE (o_ring integer, o_edge text, o_seen integer, o_pending boolean, o_partition_id bigint, o_partition text)
LANGUAGE sql STABLE AS $$
    SELECT x.ord, x.edge, x.seen, x.pending, x.id, x.name
    FROM (
        SELECT r.ord::integer AS ord, w.id, w.name,
               c.partition_id IS NULL OR w.last_offset > c.committed AS pending,
               max(w.name) OVER (PARTITION BY r.ord) AS edge,
               (count(*) OVER (PARTITION BY r.ord))::integer AS seen,
               row_number() OVER (PARTITION BY r.ord) AS rn
        FROM unnest(p_queues, p_groups, p_after) WITH ORDINALITY AS r (queue, grp, after, ord)
        JOIN queen.queues q ON q.name = r.queue
        CROSS JOIN LATERAL (
            SELECT p.id, p.name, p.last_offset FROM queen.partitions p
            WHERE p.queue_id = q.id AND p.name > r.after
            ORDER BY p.name
            LIMIT p_limit) w
        LEFT JOIN queen.consumers c ON c.partition_id = w.id AND c.consumer_group = r.grp
    ) x
    WHERE x.pending OR x.rn = 1
$$;
