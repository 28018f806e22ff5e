-- Contention (issue 29's lock benchmark): 32 contenders on one lock made
-- 48 acquire/release cycles a second, because every refused acquire ran
-- the putIfAbsent's INSERT ... ON CONFLICT, which locks the conflicting row
-- before it reads the WHERE that refuses, so refusals queued behind each
-- other and in front of the holder's release. A row that is live in the
-- statement's snapshot now answers 'exists' without a lock, and an acquire
-- skips the slots it sees held. Only a row that looks free (absent or
-- expired) is tried under the lock, which keeps putIfAbsent exact: the
-- insert still decides between two writers that both saw it free.

CREATE OR REPLACE FUNCTION queen.kv_put_v1(p_ns text, p_key text, p_value jsonb, p_ttl integer, p_expect bigint)
RETURNS queen.kv_verdict
LANGUAGE plpgsql AS $$
DECLARE
    v queen.kv_verdict;
    v_expires timestamptz := CASE WHEN p_ttl IS NULL THEN NULL ELSE now() + make_interval(secs => p_ttl) END;
BEGIN
    IF p_expect IS NULL THEN
        INSERT INTO queen.kv AS k (ns, key, value, version, expires_at)
        VALUES (p_ns, p_key, p_value, nextval('queen.kv_versions'), v_expires)
        ON CONFLICT (ns, key) DO UPDATE
            SET value = EXCLUDED.value, version = EXCLUDED.version, expires_at = EXCLUDED.expires_at,
                updated_at = now(),
                created_at = CASE WHEN k.expires_at <= now() THEN now() ELSE k.created_at END
        RETURNING true, NULL::text, k.value, k.version, k.expires_at, k.updated_at INTO v;
        RETURN v;
    ELSIF p_expect = 0 THEN
        -- A live row in this snapshot answers at once: the insert below
        -- would lock it just to learn the same, and every refused
        -- contender would queue on the row its holder needs to release.
        IF EXISTS (SELECT 1 FROM queen.kv_live_v1(p_ns, p_key, false)) THEN
            RETURN queen.kv_refused_v1(p_ns, p_key, 'exists');
        END IF;
        INSERT INTO queen.kv AS k (ns, key, value, version, expires_at)
        VALUES (p_ns, p_key, p_value, nextval('queen.kv_versions'), v_expires)
        ON CONFLICT (ns, key) DO UPDATE
            SET value = EXCLUDED.value, version = EXCLUDED.version, expires_at = EXCLUDED.expires_at,
                updated_at = now(), created_at = now()
            WHERE k.expires_at <= now()
        RETURNING true, NULL::text, k.value, k.version, k.expires_at, k.updated_at INTO v;
        IF FOUND THEN
            RETURN v;
        END IF;
        RETURN queen.kv_refused_v1(p_ns, p_key, 'exists');
    ELSE
        UPDATE queen.kv AS k
        SET value = p_value, version = nextval('queen.kv_versions'), expires_at = v_expires, updated_at = now()
        WHERE k.ns = p_ns AND k.key = p_key AND k.version = p_expect
          AND (k.expires_at IS NULL OR k.expires_at > now())
        RETURNING true, NULL::text, k.value, k.version, k.expires_at, k.updated_at INTO v;
        IF FOUND THEN
            RETURN v;
        END IF;
        v := queen.kv_refused_v1(p_ns, p_key, 'version');
        IF v.version IS NULL THEN
            v.reason := 'absent';
        END IF;
        RETURN v;
    END IF;
END
$$;

-- acquire: the permit this owner already holds (a retried call whose
-- answer was lost gets the same permit back, `o_already`), or the first
-- free slot below p_limit, taken with a putIfAbsent; nothing when every
-- slot is held.
CREATE OR REPLACE FUNCTION queen.lock_acquire_v1(p_name text, p_ttl integer, p_owner text, p_limit integer)
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
        -- Slots held in this snapshot are skipped without a lock.
        CONTINUE WHEN EXISTS (SELECT 1 FROM queen.kv_live_v1('queen-locks', p_name || '#' || s, false));
        v := queen.kv_put_v1('queen-locks', p_name || '#' || s, jsonb_build_object('owner', p_owner), p_ttl, 0);
        IF v.applied THEN
            RETURN QUERY SELECT s, v.version, false, v.expires_at;
            RETURN;
        END IF;
    END LOOP;
END
$$;
