-- Locks per tenant (issue 49): a lock's permits live in its tenant's locks
-- namespace, `queen-locks` for the default tenant and the same name behind
-- the tenant's prefix for the others (src/tenancy.rs), so two tenants'
-- locks of one name are two locks. The v3 functions are the v2 ones (0023)
-- with the namespace as their first argument; the v2 ones stay for brokers
-- of the previous version during a rolling upgrade.

CREATE FUNCTION queen.lock_holders_v3(p_ns text, p_name text)
RETURNS TABLE (o_slot integer, o_owner text, o_token bigint, o_since timestamptz, o_expires_at timestamptz, o_renewed_at timestamptz, o_sub text)
LANGUAGE sql STABLE AS $$
    SELECT substr(k.key, length(p_name) + 2)::integer, k.value->>'owner', k.version, k.created_at, k.expires_at, k.updated_at, k.value->>'sub'
    FROM queen.kv k
    WHERE k.ns = p_ns AND starts_with(k.key, p_name || '#')
      AND substr(k.key, length(p_name) + 2) ~ '^[0-9]+$'
      AND (k.expires_at IS NULL OR k.expires_at > now())
    ORDER BY 1;
$$;

CREATE FUNCTION queen.lock_acquire_v3(p_ns text, p_name text, p_ttl integer, p_owner text, p_limit integer, p_sub text)
RETURNS TABLE (o_slot integer, o_token bigint, o_already boolean, o_expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v queen.kv_verdict;
BEGIN
    RETURN QUERY
        SELECT h.o_slot, h.o_token, true, h.o_expires_at FROM queen.lock_holders_v3(p_ns, p_name) h
        WHERE h.o_owner = p_owner AND h.o_sub IS NOT DISTINCT FROM p_sub AND h.o_slot < p_limit LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    FOR s IN 0 .. p_limit - 1 LOOP
        SELECT false, 'exists', k.value, k.version, k.expires_at, k.updated_at INTO v
        FROM queen.kv_live_v1(p_ns, p_name || '#' || s, false) k;
        IF NOT FOUND THEN
            v := queen.kv_put_v1(p_ns, p_name || '#' || s, jsonb_strip_nulls(jsonb_build_object('owner', p_owner, 'sub', p_sub)), p_ttl, 0);
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
