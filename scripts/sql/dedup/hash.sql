WITH h AS MATERIALIZED (SELECT (random() * 9.2e18)::bigint AS hash, o FROM generate_series(1, 100) o),
d AS (SELECT t.txn_hash FROM hash_index t WHERE t.txn_hash = ANY (ARRAY(SELECT hash FROM h)) AND t.partition_id = :client_id + 1
        AND t.created_at > now() - interval '1 hour')
INSERT INTO hash_index (partition_id, txn_hash, msg_offset, created_at)
SELECT :client_id + 1, hash, o, now() FROM h WHERE NOT EXISTS (SELECT 1 FROM d WHERE d.txn_hash = h.hash);
