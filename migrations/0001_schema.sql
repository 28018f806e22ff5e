-- The log's tables: queues, partitions, segments, the transaction index,
-- consumer cursors, subscription records and dead letters, then the
-- bookkeeping of the pop path and the background services. The functions
-- that read and write them follow, one file per stage of a message's life:
-- 0002 push, 0003 pop, 0004 ack, 0005 admin, 0006 maintenance.
--
-- This is the baseline of an unreleased schema: migrations 0001-0022 of the
-- development history squashed into the objects that are live (issue 26,
-- docs/DECISIONS.md "One baseline schema"). From here on a landed migration
-- is never edited; a change is a new numbered file.
--
-- Invariants every function keeps:
--   * offsets are gap-free: a push reserves them on the partition row under
--     its lock, and a push refused as a duplicate gives them back;
--   * segments of a partition are disjoint ranges and their created_at is
--     monotone in base_offset, so "the newest segment" and "the segment
--     covering offset k" are both one backward primary-key step;
--   * a cursor row holds at most one lease;
--   * no column that a push, claim or commit updates is indexed, so those
--     updates stay HOT; the small hot tables get a fillfactor that leaves
--     room for them and vacuum_truncate off, because heap truncation takes an
--     ACCESS EXCLUSIVE lock that freezes push and pop for seconds under load.

CREATE TABLE queen.queues (
    id                               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                             text NOT NULL UNIQUE,
    namespace                        text NOT NULL DEFAULT '',
    task                             text NOT NULL DEFAULT '',
    -- The 21 options of API.md §2.6 with their /configure defaults. A queue
    -- created implicitly by a push or pop sets lease_time 60 explicitly.
    lease_time                       integer NOT NULL DEFAULT 300,
    retry_limit                      integer NOT NULL DEFAULT 3,
    retry_delay                      integer NOT NULL DEFAULT 1000,
    priority                         integer NOT NULL DEFAULT 0,
    max_size                         integer NOT NULL DEFAULT 0,
    ttl                              integer NOT NULL DEFAULT 3600,
    dead_letter_queue                boolean NOT NULL DEFAULT true,
    dlq_after_max_retries            boolean NOT NULL DEFAULT true,
    delayed_processing               integer NOT NULL DEFAULT 0,
    window_buffer                    integer NOT NULL DEFAULT 0,
    retention_seconds                integer NOT NULL DEFAULT 0,
    completed_retention_seconds      integer NOT NULL DEFAULT 0,
    retention_enabled                boolean NOT NULL DEFAULT false,
    encryption_enabled               boolean NOT NULL DEFAULT false,
    max_wait_time_seconds            integer NOT NULL DEFAULT 0,
    min_pop_wait_time                integer NOT NULL DEFAULT 0
        CHECK (min_pop_wait_time BETWEEN 0 AND 60000),
    dedup_window_seconds             integer NOT NULL DEFAULT 3600 CHECK (dedup_window_seconds >= 0),
    retention_sink_hold              text NOT NULL DEFAULT ''
        CHECK (retention_sink_hold ~ '^[A-Za-z0-9._-]{0,64}$'),
    retention_sink_hold_max_seconds  integer NOT NULL DEFAULT 604800
        CHECK (retention_sink_hold_max_seconds BETWEEN 60 AND 31536000),
    created_at                       timestamptz NOT NULL DEFAULT now(),
    updated_at                       timestamptz NOT NULL DEFAULT now(),
    -- When the queue last went through /api/v1/configure; NULL for a queue a
    -- push or pop created and nobody configured since. The seeds give a
    -- queue's lease two defaults: 60 s for an implicit queue, 300 for one
    -- "created or updated through /api/v1/configure", so a configure naming
    -- no leaseTime moves an implicit queue's 60 to 300 and leaves a
    -- configured queue's lease as it was (configure merges).
    configured_at                    timestamptz
);
CREATE INDEX queues_namespace_task ON queen.queues (namespace, task);

-- An ordered lane. last_offset is the newest message's offset (-1 when
-- empty); offsets are reserved here under the row lock, which is what makes
-- them gap-free. last_write_at is monotone and doubles as the created_at of
-- the newest segment.
CREATE TABLE queen.partitions (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id       bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name           text NOT NULL,
    last_offset    bigint NOT NULL DEFAULT -1,
    log_start      bigint NOT NULL DEFAULT 0,
    last_write_at  timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
) WITH (fillfactor = 70, vacuum_truncate = off);

-- One row per coalesced write. Ranges of a partition are disjoint and
-- created_at is monotone in base_offset, so "newest segment" and "segment
-- covering offset k" are both one backward primary-key step. blob is one zstd
-- frame of stored frames (API.md §3.2); PostgreSQL never looks inside it.
CREATE TABLE queen.segments (
    partition_id  bigint NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    base_offset   bigint NOT NULL,
    end_offset    bigint NOT NULL,
    msg_count     integer NOT NULL CHECK (msg_count > 0 AND end_offset = base_offset + msg_count - 1),
    created_at    timestamptz NOT NULL,
    blob          bytea NOT NULL,
    PRIMARY KEY (partition_id, base_offset)
);
ALTER TABLE queen.segments ALTER COLUMN blob SET STORAGE EXTERNAL; -- already compressed

-- Retention and the dedup purge find their work by segment age. Segments
-- are insert-only, so this index costs one entry per coalesced write and is
-- never updated.
CREATE INDEX segments_created_at ON queen.segments (created_at);

-- The only per-message row: (partition, 64-bit hash of the transactionId) →
-- offset. It deduplicates pushes inside the queue's window and lets an ack
-- that names a transactionId find its offset. No foreign key: that would cost
-- one lookup per message; rows go with their partition explicitly.
CREATE TABLE queen.txn_index (
    partition_id  bigint NOT NULL,
    txn_hash      bigint NOT NULL,
    msg_offset    bigint NOT NULL,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (partition_id, txn_hash)
);

-- One cursor per (partition, group). committed = last acknowledged offset
-- (-1 = none). A row holds at most one lease: exactly one in-flight leased
-- batch per (partition, group), the span (committed, batch_end]. None of the
-- lease columns is indexed.
--
-- No foreign key to the partition: at first contact a group's cursors are
-- written one per partition in one statement, and the key's locking lookup
-- of the partition was a third of that. The trigger below removes a
-- partition's cursors with it instead, once per deleting statement.
CREATE TABLE queen.consumers (
    partition_id       bigint NOT NULL,
    consumer_group     text NOT NULL,
    committed          bigint NOT NULL DEFAULT -1,
    worker_id          text,
    lease_expires_at   timestamptz,
    lease_acquired_at  timestamptz,
    batch_end          bigint,
    attempt_count      integer NOT NULL DEFAULT 0,
    attempt_offset     bigint,
    retry_count        integer NOT NULL DEFAULT 0,
    total_consumed     bigint NOT NULL DEFAULT 0,
    last_consumed_at   timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group)
) WITH (fillfactor = 50, vacuum_truncate = off);

-- A group's durable starting point on a queue, decided on first contact and
-- changed only by the subscription and seek routes.
CREATE TABLE queen.subscriptions (
    queue_id                bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    consumer_group          text NOT NULL,
    subscription_mode       text NOT NULL DEFAULT 'all',
    subscription_timestamp  timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, consumer_group)
);

-- A snapshot of each dead-lettered message, kept after retention removes
-- its segment.
CREATE TABLE queen.dead_letters (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id        bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    partition_id    bigint NOT NULL,
    consumer_group  text NOT NULL,
    msg_offset      bigint NOT NULL,
    message_id      uuid NOT NULL,
    transaction_id  text NOT NULL,
    trace_id        uuid,
    producer_sub    text,
    payload         jsonb,
    error_message   text,
    retry_count     integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL,
    failed_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_queue_failed ON queen.dead_letters (queue_id, failed_at DESC);
CREATE INDEX dead_letters_address ON queen.dead_letters (partition_id, transaction_id);

-- A partition's cursors go with it (see queen.consumers): retention's
-- partition cleanup and a queue's deletion, whose cascade deletes its
-- partitions.
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

-- One row of a pop: the claim's row (queen.pop_claim_v1, 0003_pop.sql) with
-- the partition and queue it belongs to. Every pop route returns this shape.
CREATE TYPE queen.pop_row AS (
    o_partition_id bigint, o_partition text, o_queue text, o_kind text,
    o_base_offset bigint, o_start_idx integer, o_take integer, o_created_at timestamptz,
    o_blob bytea, o_first bigint, o_last bigint, o_attempt integer, o_msg_count integer);

-- Per (queue, group) bookkeeping of the SQL candidate path: partitions not
-- written since watermark - 2 minutes are not candidates; checked_at
-- throttles the lease-blind re-check that may advance it.
CREATE TABLE queen.scan_watermarks (
    queue_id        bigint NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    consumer_group  text NOT NULL,
    watermark       timestamptz NOT NULL DEFAULT '-infinity',
    checked_at      timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (queue_id, consumer_group)
) WITH (fillfactor = 50, vacuum_truncate = off);

-- The dedup purge's progress per partition: every segment below
-- purged_below has had its index entries removed, and oldest_at is the
-- creation time of the first segment not yet purged (NULL: not known yet,
-- look), so the due check compares it with the queue's window as it is now.
-- What is due is always a prefix from purged_below, and a partition with
-- nothing new costs no more than its row.
CREATE TABLE queen.dedup_purge_marks (
    partition_id  bigint PRIMARY KEY REFERENCES queen.partitions (id) ON DELETE CASCADE,
    purged_below  bigint NOT NULL DEFAULT 0,
    oldest_at     timestamptz
);

-- Partitions retention emptied: candidates for the empty-partition cleanup,
-- so that service never walks the partition table.
CREATE TABLE queen.empty_partitions (
    partition_id  bigint PRIMARY KEY,
    emptied_at    timestamptz NOT NULL DEFAULT now()
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
