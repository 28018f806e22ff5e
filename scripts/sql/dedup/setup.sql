-- Four stores of the dedup index, each preloaded with 2,000,000 entries over
-- 8 partitions (scripts/bench-dedup-index.sh; issue 34).
-- current: the broker's txn_index, a B-tree primary key, written by upsert.
CREATE TABLE current_index (partition_id bigint NOT NULL, txn_hash bigint NOT NULL, msg_offset bigint NOT NULL,
                            created_at timestamptz NOT NULL, PRIMARY KEY (partition_id, txn_hash));
INSERT INTO current_index SELECT g % 8 + 1, (random() * 9.2e18)::bigint, g, now() FROM generate_series(1, 2000000) g ON CONFLICT DO NOTHING;
-- hash: no unique key; a hash index on the hash, looked up then inserted
-- under the partition row lock the push already holds.
CREATE TABLE hash_index (partition_id bigint NOT NULL, txn_hash bigint NOT NULL, msg_offset bigint NOT NULL, created_at timestamptz NOT NULL);
INSERT INTO hash_index SELECT g % 8 + 1, (random() * 9.2e18)::bigint, g, now() FROM generate_series(1, 2000000) g;
CREATE INDEX hash_index_hash ON hash_index USING hash (txn_hash);
-- buckets: a ring of six time buckets (PostgreSQL partitions), each a small
-- B-tree; inserts go to the current one, a lookup probes all six.
CREATE TABLE buckets (bucket int NOT NULL, partition_id bigint NOT NULL, txn_hash bigint NOT NULL, msg_offset bigint NOT NULL,
                      created_at timestamptz NOT NULL) PARTITION BY LIST (bucket);
DO $$ BEGIN FOR b IN 0..5 LOOP
    EXECUTE format('CREATE TABLE buckets_%s PARTITION OF buckets FOR VALUES IN (%s)', b, b);
    EXECUTE format('CREATE INDEX ON buckets_%s (partition_id, txn_hash)', b);
END LOOP; END $$;
INSERT INTO buckets SELECT g % 6, g % 8 + 1, (random() * 9.2e18)::bigint, g, now() FROM generate_series(1, 2000000) g;
-- gin: one row per segment with its hashes as an array, a GIN index with a
-- small pending list.
CREATE TABLE gin_segments (partition_id bigint NOT NULL, base_offset bigint NOT NULL, created_at timestamptz NOT NULL,
                           hashes bigint[] NOT NULL, PRIMARY KEY (partition_id, base_offset));
INSERT INTO gin_segments SELECT g % 8 + 1, g, now(), (SELECT array_agg((random() * 9.2e18)::bigint + 0 * x + 0 * g) FROM generate_series(1, 100) x)
FROM generate_series(1, 20000) g;
CREATE INDEX gin_segments_hashes ON gin_segments USING gin (hashes) WITH (fastupdate = on, gin_pending_list_limit = 512);
CREATE SEQUENCE segment_base START 3000000;
VACUUM ANALYZE;
CHECKPOINT;
