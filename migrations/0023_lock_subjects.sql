-- A permit remembers who took it (issue 45): the caller's JWT subject is
-- stored beside the owner in the permit row ('{"owner": ..., "sub": ...}').
--
-- Tokens come from the KV version sequence: they only grow, so they can be
-- guessed from one's own, and owners are shown to anyone who asks who
-- holds a lock. Neither is a secret, so neither alone may hand out a
-- permit's token or move the permit: an owner's retried acquire answers the
-- token only to the subject that took the permit, and the broker renews or
-- releases a permit only for that subject (src/locks/mod.rs). Without
-- authentication every caller's subject is NULL and this is the behaviour
-- of lock_acquire_v1.
--
-- The _v1 functions stay for brokers of the previous version sharing the
-- database; their permits carry no subject (NULL), as their callers do.

-- The live permits of a lock, slot by slot, with the subject that took each.
CREATE FUNCTION queen.lock_holders_v2(p_name text)
RETURNS TABLE (o_slot integer, o_owner text, o_token bigint, o_since timestamptz, o_expires_at timestamptz, o_renewed_at timestamptz, o_sub text)
LANGUAGE sql STABLE AS $$
    SELECT substr(k.key, length(p_name) + 2)::integer, k.value->>'owner', k.version, k.created_at, k.expires_at, k.updated_at, k.value->>'sub'
    FROM queen.kv k
    WHERE k.ns = 'queen-locks' AND starts_with(k.key, p_name || '#')
      AND substr(k.key, length(p_name) + 2) ~ '^[0-9]+$'
      AND (k.expires_at IS NULL OR k.expires_at > now())
    ORDER BY 1;
$$;

-- acquire, as lock_acquire_v1 (0020), where "this owner's permit" means
-- this owner's *and this subject's*: a permit of the same owner name taken
-- by another subject is held, like any other.
CREATE FUNCTION queen.lock_acquire_v2(p_name text, p_ttl integer, p_owner text, p_limit integer, p_sub text)
RETURNS TABLE (o_slot integer, o_token bigint, o_already boolean, o_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v queen.kv_verdict;
BEGIN
    RETURN QUERY
        SELECT h.o_slot, h.o_token, true, h.o_expires_at FROM queen.lock_holders_v2(p_name) h
        WHERE h.o_owner = p_owner AND h.o_sub IS NOT DISTINCT FROM p_sub AND h.o_slot < p_limit LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    FOR s IN 0 .. p_limit - 1 LOOP
        SELECT false, 'exists', k.value, k.version, k.expires_at, k.updated_at INTO v
        FROM queen.kv_live_v1('queen-locks', p_name || '#' || s, false) k;
        IF NOT FOUND THEN
            v := queen.kv_put_v1('queen-locks', p_name || '#' || s, jsonb_strip_nulls(jsonb_build_object('owner', p_owner, 'sub', p_sub)), p_ttl, 0);
            IF v.applied THEN
                RETURN QUERY SELECT s, v.version, false, v.expires_at;
                RETURN;
            END IF;
        END IF;
        IF v.value->>'owner' = p_owner AND (v.value->>'sub') IS NOT DISTINCT FROM p_sub THEN
            RETURN QUERY SELECT s, v.version, true, v.expires_at;
            RETURN;
        END IF;
    END LOOP;
END
$$;
