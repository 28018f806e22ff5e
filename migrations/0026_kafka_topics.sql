-- Kafka topics' declared widths (issue 47, docs/KAFKA.md). A Queen queue has
-- no width: its partitions are made by the writes that name them. A Kafka
-- client needs one, so a topic advertises the larger of its declared width
-- (CreateTopics, raised by CreatePartitions; QUEEN_KAFKA_DEFAULT_PARTITIONS
-- for a queue that declared none) and one past its highest numeric
-- partition.
--
-- Invariant: a declared width only grows (CreatePartitions refuses a
-- smaller or equal count), so a topic's advertised width never shrinks. The
-- row goes with its queue.
CREATE TABLE queen.kafka_topics (
    queue_id    bigint PRIMARY KEY REFERENCES queen.queues (id) ON DELETE CASCADE,
    partitions  integer NOT NULL CHECK (partitions > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Idempotent producers' ids (InitProducerId, src/kafka/idempotence.rs):
-- unique across every broker of the database and across restarts, so a
-- producer is never mistaken for another.
CREATE SEQUENCE queen.kafka_producer_ids AS bigint MINVALUE 0 START 0;

-- The Kafka listeners of the brokers on this database (src/kafka/nodes.rs):
-- each registers its advertised address under a node id of its own and
-- refreshes heartbeat_at once a second; a node whose heartbeat is older
-- than five seconds is not live. Every broker reads the same live list, so
-- all give the same partition leaders and group coordinators.
CREATE TABLE queen.kafka_nodes (
    node_id       integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    host          text NOT NULL,
    port          integer NOT NULL,
    heartbeat_at  timestamptz NOT NULL
);
