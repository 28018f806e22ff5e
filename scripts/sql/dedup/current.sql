WITH h AS (SELECT (random() * 9.2e18)::bigint AS hash, o FROM generate_series(1, 100) o)
INSERT INTO current_index AS t (partition_id, txn_hash, msg_offset, created_at)
SELECT DISTINCT ON (hash) :client_id + 1, hash, o, now() FROM h ORDER BY hash, o
ON CONFLICT (partition_id, txn_hash) DO UPDATE SET msg_offset = EXCLUDED.msg_offset, created_at = EXCLUDED.created_at
WHERE t.created_at <= EXCLUDED.created_at - interval '1 hour';
