-- Background services: retention, the dedup-window purge, and the metrics
-- samples behind the analytics routes.

-- Retention and the dedup purge find their work by segment age. Segments
-- are insert-only, so this index costs one entry per coalesced write and is
-- never updated.
CREATE INDEX segments_created_at ON queen.segments (created_at);

-- Where each per-queue background walk stopped: (created_at, partition,
-- base_offset) of the last segment it handled.
CREATE TABLE queen.maintenance_cursors (
    queue_id     bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    service      text NOT NULL,
    at           timestamptz NOT NULL DEFAULT 'epoch',
    partition_id bigint NOT NULL DEFAULT 0,
    base_offset  bigint NOT NULL DEFAULT -1,
    PRIMARY KEY (queue_id, service)
);

-- Per-minute traffic per queue, written by every broker (one row per
-- broker, queue and minute), summed by the analytics routes.
CREATE TABLE queen.metrics_samples (
    sampled_at  timestamptz NOT NULL,
    queue_name  text NOT NULL,
    broker      text NOT NULL,
    pushed      bigint NOT NULL DEFAULT 0,
    popped      bigint NOT NULL DEFAULT 0,
    acked       bigint NOT NULL DEFAULT 0
);
CREATE INDEX metrics_samples_at ON queen.metrics_samples (sampled_at);

-- Partitions retention emptied: candidates for the empty-partition cleanup,
-- so that service never walks the partition table.
CREATE TABLE queen.empty_partitions (
    partition_id  bigint PRIMARY KEY,
    emptied_at    timestamptz NOT NULL DEFAULT now()
);

-- Deletes up to p_batch expired segments: for queues with retentionSeconds,
-- segments older than it; for queues with completedRetentionSeconds,
-- segments older than that which every cursor of the partition has passed
-- and every group subscribed to the queue has a cursor on. log_start of every
-- touched partition moves to its first remaining offset, so a cursor left in
-- the gap scans forward. Returns how many segments went.
CREATE FUNCTION queen.retention_v1(p_batch integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n       integer;
    v_min_age integer;
BEGIN
    -- The shortest age any queue keeps: a constant bound, so the walk is a
    -- range scan of segments_created_at over old segments only.
    SELECT min(LEAST(NULLIF(q.retention_seconds, 0), NULLIF(q.completed_retention_seconds, 0)))
    INTO v_min_age FROM queen.queues q
    WHERE q.retention_seconds > 0 OR q.completed_retention_seconds > 0;
    IF v_min_age IS NULL THEN
        RETURN 0;
    END IF;
    WITH doomed AS (
        SELECT s.partition_id, s.base_offset
        FROM queen.segments s
        JOIN queen.partitions p ON p.id = s.partition_id
        JOIN queen.queues q ON q.id = p.queue_id
        WHERE s.created_at < now() - make_interval(secs => v_min_age)
          AND (
            (q.retention_seconds > 0 AND s.created_at < now() - make_interval(secs => q.retention_seconds))
            OR (q.completed_retention_seconds > 0
                AND s.created_at < now() - make_interval(secs => q.completed_retention_seconds)
                AND EXISTS (SELECT 1 FROM queen.consumers c WHERE c.partition_id = s.partition_id)
                AND NOT EXISTS (SELECT 1 FROM queen.consumers c
                                WHERE c.partition_id = s.partition_id AND c.committed < s.end_offset)
                AND NOT EXISTS (SELECT 1 FROM queen.subscriptions sub
                                WHERE sub.queue_id = q.id AND NOT EXISTS (
                                    SELECT 1 FROM queen.consumers c
                                    WHERE c.partition_id = s.partition_id AND c.consumer_group = sub.consumer_group))))
        ORDER BY s.created_at
        LIMIT p_batch
    ), deleted AS (
        DELETE FROM queen.segments s USING doomed d
        WHERE s.partition_id = d.partition_id AND s.base_offset = d.base_offset
        RETURNING s.partition_id
    ), touched AS (
        UPDATE queen.partitions p
        SET log_start = COALESCE((SELECT min(s.base_offset) FROM queen.segments s WHERE s.partition_id = p.id
                                  AND NOT EXISTS (SELECT 1 FROM doomed d WHERE d.partition_id = s.partition_id
                                                  AND d.base_offset = s.base_offset)),
                                 p.last_offset + 1)
        WHERE p.id IN (SELECT DISTINCT partition_id FROM deleted)
        RETURNING p.id, p.log_start > p.last_offset AS empty
    ), noted AS (
        INSERT INTO queen.empty_partitions (partition_id)
        SELECT id FROM touched WHERE empty
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO v_n FROM deleted;
    RETURN v_n;
END
$$;

-- Removes up to p_batch partitions that retention emptied and that nobody
-- has written to for p_idle: the partition row, its cursors (cascade) and
-- its index entries. A candidate written to again is just forgotten.
CREATE FUNCTION queen.cleanup_partitions_v1(p_idle interval, p_batch integer)
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
    ), gone AS (
        DELETE FROM queen.partitions p USING doomed d WHERE p.id = d.id RETURNING p.id
    ), forgotten AS (
        DELETE FROM queen.empty_partitions e USING gone g WHERE e.partition_id = g.id RETURNING 1
    )
    SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END
$$;
