-- The streams runtime's server half (issue 30): registered queries and
-- their per-partition state. The processing runs in the clients; a cycle
-- (POST /streams/v1/cycle, src/streams/) applies a query's state ops, its
-- pushes and its ack in one transaction.

-- A query, by name. Its id is minted at the first registration and kept
-- for the name, across config changes and resets.
CREATE TABLE queen.stream_queries (
    id            uuid PRIMARY KEY,
    name          text NOT NULL UNIQUE,
    source_queue  text NOT NULL,
    sink_queue    text,
    config_hash   text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- State rows of a query on one source partition. ripe_at is the row's
-- value.windowEnd (epoch ms) when it has one: "window rows due at or before
-- T" is one index range.
CREATE TABLE queen.stream_state (
    query_id      uuid NOT NULL REFERENCES queen.stream_queries (id) ON DELETE CASCADE,
    partition_id  bigint NOT NULL,
    key           text NOT NULL,
    value         jsonb NOT NULL,
    ripe_at       bigint,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, partition_id, key)
);
CREATE INDEX stream_state_ripe ON queen.stream_state (query_id, partition_id, ripe_at) WHERE ripe_at IS NOT NULL;

-- A partition's stream state goes with the partition (retention's cleanup,
-- a queue's deletion).
CREATE FUNCTION queen.drop_stream_state_v1()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queen.stream_state s USING gone g WHERE s.partition_id = g.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER partitions_drop_stream_state
AFTER DELETE ON queen.partitions
REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION queen.drop_stream_state_v1();

-- Registers a query: fresh when the name is new; the same hash is a
-- restart; another hash is refused (o_conflict: the stored hash) unless
-- p_reset, which discards the query's state. The broker then deletes the
-- default consumer group's cursors on the source queue through the group
-- route's own code (src/streams/), so the stream starts from scratch.
CREATE FUNCTION queen.stream_register_v1(
    p_name text, p_source text, p_sink text, p_hash text, p_reset boolean, p_new_id uuid)
RETURNS TABLE (o_id uuid, o_fresh boolean, o_reset boolean, o_conflict text)
LANGUAGE plpgsql AS $$
DECLARE
    q queen.stream_queries;
BEGIN
    INSERT INTO queen.stream_queries (id, name, source_queue, sink_queue, config_hash)
    VALUES (p_new_id, p_name, p_source, p_sink, p_hash)
    ON CONFLICT (name) DO NOTHING;
    IF FOUND THEN
        RETURN QUERY SELECT p_new_id, true, false, NULL::text;
        RETURN;
    END IF;
    SELECT * INTO q FROM queen.stream_queries WHERE name = p_name FOR UPDATE;
    IF q.config_hash <> p_hash AND NOT p_reset THEN
        RETURN QUERY SELECT q.id, false, false, q.config_hash;
        RETURN;
    END IF;
    UPDATE queen.stream_queries
    SET source_queue = p_source, sink_queue = p_sink, config_hash = p_hash, updated_at = now()
    WHERE id = q.id;
    IF p_reset THEN
        DELETE FROM queen.stream_state WHERE query_id = q.id;
    END IF;
    RETURN QUERY SELECT q.id, false, p_reset, NULL::text;
END
$$;
