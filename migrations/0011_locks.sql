-- Locks and semaphores (issue 29 §2) are KV rows: a permit of lock N is the
-- key 'N#<slot>' in namespace 'queen-locks', written with the holder's
-- lifetime as its TTL, so an expired permit is free the moment it expires
-- (the KV predicate), whether or not any sweeper has run. The permit's KV
-- version is its fencing token: it comes from the KV version sequence, so
-- it only grows, and a renew (a put with expect = token) issues a new one.

-- The live permits of a lock, slot by slot.
CREATE FUNCTION queen.lock_holders_v1(p_name text)
RETURNS TABLE (o_slot integer, o_owner text, o_token bigint, o_since timestamptz, o_expires_at timestamptz, o_renewed_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT substr(k.key, length(p_name) + 2)::integer, k.value->>'owner', k.version, k.created_at, k.expires_at, k.updated_at
    FROM queen.kv k
    WHERE k.ns = 'queen-locks' AND starts_with(k.key, p_name || '#')
      AND substr(k.key, length(p_name) + 2) ~ '^[0-9]+$'
      AND (k.expires_at IS NULL OR k.expires_at > now())
    ORDER BY 1;
$$;

-- acquire: the permit this owner already holds (a retried call whose
-- answer was lost gets the same permit back, `o_already`), or the first
-- free slot below p_limit, taken with a putIfAbsent; nothing when every
-- slot is held.
CREATE FUNCTION queen.lock_acquire_v1(p_name text, p_ttl integer, p_owner text, p_limit integer)
RETURNS TABLE (o_slot integer, o_token bigint, o_already boolean, o_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v queen.kv_verdict;
BEGIN
    RETURN QUERY
        SELECT h.o_slot, h.o_token, true, h.o_expires_at FROM queen.lock_holders_v1(p_name) h
        WHERE h.o_owner = p_owner AND h.o_slot < p_limit LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    FOR s IN 0 .. p_limit - 1 LOOP
        v := queen.kv_put_v1('queen-locks', p_name || '#' || s, jsonb_build_object('owner', p_owner), p_ttl, 0);
        IF v.applied THEN
            RETURN QUERY SELECT s, v.version, false, v.expires_at;
            RETURN;
        END IF;
    END LOOP;
END
$$;
