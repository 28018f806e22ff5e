WITH k AS MATERIALIZED (SELECT array_agg((random() * 9.2e18)::bigint) AS hashes FROM generate_series(1, 100)),
d AS (SELECT count(*) AS n FROM gin_segments s, k WHERE s.hashes && k.hashes AND s.partition_id = :client_id + 1)
INSERT INTO gin_segments (partition_id, base_offset, created_at, hashes)
SELECT :client_id + 1, nextval('segment_base'), now(), k.hashes FROM k, d WHERE d.n = 0;
