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
-- The traces of one message, and of one partition for retention.
CREATE INDEX traces_message ON queen.traces (partition_id, transaction_id);
-- The age sweep.
CREATE INDEX traces_created_at ON queen.traces (created_at);

-- One row per (name, trace): "the traces named X, newest first" is one
-- backward range scan, and the name list is a walk of this index.
CREATE TABLE queen.trace_names (
    name        text NOT NULL,
    created_at  timestamptz NOT NULL,
    trace       bigint NOT NULL REFERENCES queen.traces (id) ON DELETE CASCADE,
    PRIMARY KEY (name, created_at, trace)
);
CREATE INDEX trace_names_trace ON queen.trace_names (trace);

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
CREATE FUNCTION queen.trace_write_v1(
    p_trace_ids uuid[], p_partitions bigint[], p_txns text[], p_groups text[],
    p_events text[], p_names jsonb[], p_data jsonb[])
RETURNS TABLE (o_trace_id uuid)
LANGUAGE sql AS $$
    WITH input AS (
        SELECT * FROM unnest(p_trace_ids, p_partitions, p_txns, p_groups, p_events, p_names, p_data)
            WITH ORDINALITY AS i (trace_id, partition_id, txn, grp, evt, names, data, ord)
        WHERE EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = i.partition_id)
    ), stored AS (
        INSERT INTO queen.traces (trace_id, partition_id, transaction_id, consumer_group, event_type, names, data)
        SELECT trace_id, partition_id, txn, grp, evt,
               ARRAY(SELECT jsonb_array_elements_text(names)), data
        FROM input ORDER BY ord
        RETURNING id, trace_id, names, created_at
    ), named AS (
        INSERT INTO queen.trace_names (name, created_at, trace)
        SELECT DISTINCT n, s.created_at, s.id FROM stored s, unnest(s.names) AS n
    )
    SELECT s.trace_id FROM stored s;
$$;

-- Removes up to p_batch traces older than p_days days; the count removed.
CREATE FUNCTION queen.trace_sweep_v1(p_days integer, p_batch integer)
RETURNS bigint
LANGUAGE sql AS $$
    WITH doomed AS (
        SELECT id FROM queen.traces
        WHERE created_at < now() - make_interval(days => p_days)
        ORDER BY created_at LIMIT p_batch
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
