WITH h AS MATERIALIZED (SELECT (random() * 9.2e18)::bigint AS hash, o FROM generate_series(1, 100) o),
d AS (SELECT t.txn_hash FROM buckets t WHERE t.partition_id = :client_id + 1 AND t.txn_hash = ANY (ARRAY(SELECT hash FROM h)))
INSERT INTO buckets_5 (bucket, partition_id, txn_hash, msg_offset, created_at)
SELECT 5, :client_id + 1, hash, o, now() FROM h WHERE NOT EXISTS (SELECT 1 FROM d WHERE d.txn_hash = h.hash);
