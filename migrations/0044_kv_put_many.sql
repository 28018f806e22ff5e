-- Plain puts in one statement (issue 46, src/kv/share.rs). A shared write
-- whose calls are all unconditional puts (no expected version) of distinct
-- keys, what a service writing one key per call sends, is one
-- INSERT ... ON CONFLICT over the batch here, instead of a call of
-- queen.kv_write_v1 (two PL/pgSQL frames and their statements) per put.
-- Each row, version and verdict is what queen.kv_put_v1 with p_expect NULL
-- gives; rows are written in the order given, which the caller makes
-- (ns, key) order, the order every shared write locks in. A key may appear
-- once (ON CONFLICT cannot update a row twice in one statement): the
-- caller sends a batch with a repeated key through kv_write_v1 instead.
-- Answers each put's (ns, key) with the key's value, version, expiry and
-- update time after it. PL/pgSQL, not SQL, for its cached plan: an SQL
-- function's statement is planned again on every call, which cost more
-- than the insert itself.
CREATE FUNCTION queen.kv_put_many_v1(p_ns text[], p_keys text[], p_values text[], p_ttls integer[])
RETURNS TABLE (o_ns text, o_key text, o_value text, o_version bigint, o_expires_at timestamptz, o_updated_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    INSERT INTO queen.kv AS k (ns, key, value, version, expires_at)
    SELECT c.ns, c.key, c.value::jsonb, nextval('queen.kv_versions'),
           CASE WHEN c.ttl IS NULL THEN NULL ELSE now() + make_interval(secs => c.ttl) END
    FROM unnest(p_ns, p_keys, p_values, p_ttls) WITH ORDINALITY AS c (ns, key, value, ttl, i)
    ORDER BY c.i
    ON CONFLICT (ns, key) DO UPDATE
        SET value = EXCLUDED.value, version = EXCLUDED.version, expires_at = EXCLUDED.expires_at,
            updated_at = now(),
            created_at = CASE WHEN k.expires_at <= now() THEN now() ELSE k.created_at END
    RETURNING k.ns, k.key, k.value::text, k.version, k.expires_at, k.updated_at;
END
$$;
