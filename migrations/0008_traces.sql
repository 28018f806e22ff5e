-- Traces: events a consumer attaches to a message while it processes it
-- (POST /api/v1/traces). They live beside the log, never inside a segment:
-- a segment is immutable and shared by many messages, and a trace arrives
-- after its message was written.
--
-- A trace names its message by (partition, transactionId), the address the
-- consumer holds. No foreign key to the partition: the key's check would
-- take a KEY SHARE lock on the partition row that every push updates. The
-- trigger below removes a partition's traces with it instead (retention's
-- partition cleanup and a queue's deletion, whose cascade deletes its
-- partitions), and retention removes the traces of the messages it removes
-- (src/maintenance/retention.rs); the trace sweeper removes what is older
-- than TRACES_RETENTION_DAYS.
CREATE TABLE queen.traces (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trace_id        uuid NOT NULL,
    partition_id    bigint NOT NULL,
    transaction_id  text NOT NULL,
    consumer_group  text NOT NULL,
    event_type      text NOT NULL,
    names           text[] NOT NULL DEFAULT '{}',
    data            jsonb,
    created_at      timestamptz NOT NULL DEFAULT now()
);
-- The traces of one message, and of one partition for retention. The age
-- sweep walks the primary key instead of an index on created_at: ids grow
-- with time, and every index is paid by every trace.
CREATE INDEX traces_message ON queen.traces (partition_id, transaction_id);

-- One row per (name, trace): "the traces named X, newest first" is one
-- backward range scan, and the name list is a walk of this index. No
-- foreign key (its check costs every trace a lookup and a trigger); the
-- trigger below removes a trace's names with it.
CREATE TABLE queen.trace_names (
    name        text NOT NULL,
    created_at  timestamptz NOT NULL,
    trace       bigint NOT NULL,
    PRIMARY KEY (name, created_at, trace)
);

CREATE FUNCTION queen.drop_trace_names_v1()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queen.trace_names n USING gone g, unnest(g.names) AS nm
    WHERE n.name = nm AND n.created_at = g.created_at AND n.trace = g.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER traces_drop_names
AFTER DELETE ON queen.traces
REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION queen.drop_trace_names_v1();

CREATE FUNCTION queen.drop_traces_v1()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queen.traces t USING gone g WHERE t.partition_id = g.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER partitions_drop_traces
AFTER DELETE ON queen.partitions
REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION queen.drop_traces_v1();

-- Writes a batch of traces in one statement: the rows whose partition
-- exists are stored with their names; the answer lists the trace ids that
-- were stored, so the writer can answer each request on its own.
--
-- The transaction commits without waiting for its WAL to reach the disk
-- (set_config local to the caller's transaction, which a function's SET
-- clause would not be): a trace answered before a PostgreSQL crash may be
-- lost, never one answered before a broker crash (docs/DECISIONS.md,
-- "Traces commit without waiting for the disk"). plpgsql, so that each
-- connection plans the statement once.
CREATE FUNCTION queen.trace_write_v1(
    p_trace_ids uuid[], p_partitions bigint[], p_txns text[], p_groups text[],
    p_events text[], p_names jsonb[], p_data jsonb[])
RETURNS TABLE (o_trace_id uuid)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(p_trace_ids, p_partitions, p_txns, p_groups, p_events, p_names, p_data)
            WITH ORDINALITY AS i (trace_id, partition_id, txn, grp, evt, names, data, ord)
        WHERE EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = i.partition_id)
    ), stored AS (
        INSERT INTO queen.traces (trace_id, partition_id, transaction_id, consumer_group, event_type, names, data)
        SELECT i.trace_id, i.partition_id, i.txn, i.grp, i.evt,
               ARRAY(SELECT jsonb_array_elements_text(i.names)), i.data
        FROM input i ORDER BY i.ord
        RETURNING id, trace_id, names, created_at
    ), named AS (
        INSERT INTO queen.trace_names (name, created_at, trace)
        SELECT DISTINCT n, s.created_at, s.id FROM stored s, unnest(s.names) AS n
    )
    SELECT s.trace_id FROM stored s;
END
$$;

-- Removes up to p_batch traces older than p_days days, oldest id first;
-- the count removed.
CREATE FUNCTION queen.trace_sweep_v1(p_days integer, p_batch integer)
RETURNS bigint
LANGUAGE sql AS $$
    WITH doomed AS (
        SELECT id FROM (SELECT id, created_at FROM queen.traces ORDER BY id LIMIT p_batch) oldest
        WHERE created_at < now() - make_interval(days => p_days)
    ), gone AS (
        DELETE FROM queen.traces t USING doomed d WHERE t.id = d.id RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;

-- Removes the traces of messages retention removed: on each partition in
-- p_partitions, the traces older than its oldest remaining segment (a trace
-- is written after its message, so an older trace belongs to a message of
-- a removed segment), all of them when the partition is empty.
CREATE FUNCTION queen.trace_follow_retention_v1(p_partitions bigint[])
RETURNS bigint
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM queen.traces t
        USING (SELECT DISTINCT unnest(p_partitions) AS id) p
        WHERE t.partition_id = p.id
          AND t.created_at < COALESCE(
                (SELECT s.created_at FROM queen.segments s WHERE s.partition_id = p.id
                 ORDER BY s.base_offset LIMIT 1), 'infinity')
        RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;
