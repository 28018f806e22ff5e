-- Reseeding many idle rings in one call.
--
-- Each hot-list ring (one per queue and group a broker serves) is reseeded
-- from SQL every QUEEN_HOTLIST_RESEED_MS to learn what the broker cannot see
-- itself (another broker's pushes, retention, seeks). With 10,000 parked
-- consumers that was ~330 single-ring queries a second, most of the idle
-- broker's CPU. The broker now reseeds its idle rings in the background, all
-- rings that fell due in one call: hotlist_seed_v1's rule for every
-- (queue, group) pair, tagged with the pair's ordinal.
CREATE FUNCTION queen.hotlist_seed_many_v1(p_queues text[], p_groups text[])
RETURNS TABLE (o_ring integer, o_partition_id bigint, o_partition text)
LANGUAGE sql STABLE AS $$
    SELECT r.ord::integer, p.id, p.name
    FROM unnest(p_queues, p_groups) WITH ORDINALITY AS r (queue, grp, ord)
    JOIN queen.queues q ON q.name = r.queue
    JOIN queen.partitions p ON p.queue_id = q.id
    LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = r.grp
    WHERE c.partition_id IS NULL OR p.last_offset > c.committed
$$;
