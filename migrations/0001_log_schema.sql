-- The log: queues, partitions, segments, the transaction index, consumer
-- cursors, subscription records and dead letters (ARCHITECTURE.md §2).
--
-- Hot-path rule: no column that a push, claim or commit updates is indexed,
-- so those updates stay HOT; the small hot tables get a fillfactor that leaves
-- room for them and vacuum_truncate off, because heap truncation takes an
-- ACCESS EXCLUSIVE lock that freezes push and pop for seconds under load.

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
    updated_at                       timestamptz NOT NULL DEFAULT now()
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
-- batch per (partition, group). None of the lease columns is indexed.
CREATE TABLE queen.consumers (
    partition_id       bigint NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
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
