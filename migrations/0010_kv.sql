-- KV: namespaced keys holding JSON values, in the same database and the
-- same transactions as the log (issue 29 §1), so every broker in front of
-- one PostgreSQL sees one truth and a transaction can guard its commit on a
-- key.
--
-- A version comes from one sequence and so only grows, across keys and
-- across a delete and a re-create: an `expect` read before a key was deleted
-- and written again can never match the new row (no ABA). A row past its
-- expires_at is invisible to every read and counts as absent for every
-- write the moment it expires; the KV sweeper (src/maintenance/kv_expiry.rs)
-- only reclaims the space.
CREATE SEQUENCE queen.kv_versions;

CREATE TABLE queen.kv (
    ns          text NOT NULL,
    key         text NOT NULL,
    value       jsonb NOT NULL,
    version     bigint NOT NULL,
    expires_at  timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (ns, key)
) WITH (fillfactor = 80);
CREATE INDEX kv_expires_at ON queen.kv (expires_at) WHERE expires_at IS NOT NULL;

-- Every write answers this row: whether it applied, why not, and the key's
-- value and version after the operation (the current ones when it did not
-- apply, so the loser needs no second read).
CREATE TYPE queen.kv_verdict AS (
    applied boolean, reason text, value jsonb, version bigint, expires_at timestamptz, updated_at timestamptz);

-- The live row of (ns, key), or nothing; p_lock takes a share lock on it so
-- that a guard holds until the caller's commit.
CREATE FUNCTION queen.kv_live_v1(p_ns text, p_key text, p_lock boolean)
RETURNS SETOF queen.kv
LANGUAGE plpgsql AS $$
BEGIN
    IF p_lock THEN
        RETURN QUERY SELECT * FROM queen.kv k WHERE k.ns = p_ns AND k.key = p_key
                     AND (k.expires_at IS NULL OR k.expires_at > now()) FOR SHARE;
    ELSE
        RETURN QUERY SELECT * FROM queen.kv k WHERE k.ns = p_ns AND k.key = p_key
                     AND (k.expires_at IS NULL OR k.expires_at > now());
    END IF;
END
$$;

-- The verdict of a write that did not apply: the reason and the live row.
CREATE FUNCTION queen.kv_refused_v1(p_ns text, p_key text, p_reason text)
RETURNS queen.kv_verdict
LANGUAGE sql AS $$
    SELECT false, p_reason, k.value, k.version, k.expires_at, k.updated_at
    FROM (SELECT 1) one LEFT JOIN queen.kv_live_v1(p_ns, p_key, false) k ON true;
$$;

-- put / putIfAbsent. p_ttl NULL = forever. p_expect: NULL = unconditional,
-- 0 = must not exist (an expired row does not exist), N = must be at
-- version N (creates nothing otherwise). One statement per case, so
-- concurrent writers are ordered by the row lock: of N concurrent
-- putIfAbsent exactly one applies.
CREATE FUNCTION queen.kv_put_v1(p_ns text, p_key text, p_value jsonb, p_ttl integer, p_expect bigint)
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

-- delete. p_expect as for put; without it, deleting an absent key does not
-- apply (reason 'absent').
CREATE FUNCTION queen.kv_delete_v1(p_ns text, p_key text, p_expect bigint)
RETURNS queen.kv_verdict
LANGUAGE plpgsql AS $$
DECLARE
    v queen.kv_verdict;
    v_live boolean;
BEGIN
    IF p_expect = 0 THEN
        v := queen.kv_refused_v1(p_ns, p_key, 'exists');
        IF v.version IS NULL THEN
            v.applied := true;
            v.reason := NULL;
        END IF;
        RETURN v;
    END IF;
    DELETE FROM queen.kv k
    WHERE k.ns = p_ns AND k.key = p_key AND (p_expect IS NULL OR k.version = p_expect OR k.expires_at <= now())
    RETURNING k.expires_at IS NULL OR k.expires_at > now(), k.value, k.version INTO v_live, v.value, v.version;
    IF FOUND AND v_live THEN
        RETURN (true, NULL, NULL, NULL, NULL, NULL)::queen.kv_verdict;
    END IF;
    v := queen.kv_refused_v1(p_ns, p_key, 'version');
    IF v.version IS NULL THEN
        v.reason := 'absent';
    END IF;
    RETURN v;
END
$$;

-- check: a precondition that writes nothing. expect 0 = must not exist,
-- N = must be at version N. The live row is share-locked, so a check that
-- held still holds when the caller's transaction commits.
CREATE FUNCTION queen.kv_check_v1(p_ns text, p_key text, p_expect bigint)
RETURNS queen.kv_verdict
LANGUAGE plpgsql AS $$
DECLARE
    r queen.kv;
BEGIN
    SELECT * INTO r FROM queen.kv_live_v1(p_ns, p_key, true);
    IF NOT FOUND THEN
        RETURN (p_expect = 0, CASE WHEN p_expect = 0 THEN NULL ELSE 'absent' END, NULL, NULL, NULL, NULL)::queen.kv_verdict;
    END IF;
    IF p_expect = r.version THEN
        RETURN (true, NULL, r.value, r.version, r.expires_at, r.updated_at)::queen.kv_verdict;
    END IF;
    RETURN (false, CASE WHEN p_expect = 0 THEN 'exists' ELSE 'version' END, r.value, r.version, r.expires_at, r.updated_at)::queen.kv_verdict;
END
$$;

-- incr: adds p_delta to a numeric value (an absent or expired key counts as
-- 0 and takes the expiry p_ttl, NULL = forever; a live key keeps its own).
-- A result outside [p_min, p_max] does not apply (reason 'limit': the
-- ceiling refuses, it does not saturate); a value that is not a number is
-- reason 'type'.
CREATE FUNCTION queen.kv_incr_v1(p_ns text, p_key text, p_delta numeric, p_min numeric, p_max numeric, p_ttl integer)
RETURNS queen.kv_verdict
LANGUAGE plpgsql AS $$
DECLARE
    r queen.kv;
    v queen.kv_verdict;
    v_next numeric;
BEGIN
    FOR attempt IN 1..3 LOOP
        SELECT * INTO r FROM queen.kv k WHERE k.ns = p_ns AND k.key = p_key FOR UPDATE;
        IF FOUND AND (r.expires_at IS NULL OR r.expires_at > now()) THEN
            IF jsonb_typeof(r.value) <> 'number' THEN
                RETURN (false, 'type', r.value, r.version, r.expires_at, r.updated_at)::queen.kv_verdict;
            END IF;
            v_next := (r.value #>> '{}')::numeric + p_delta;
            IF v_next < p_min OR v_next > p_max THEN
                RETURN (false, 'limit', r.value, r.version, r.expires_at, r.updated_at)::queen.kv_verdict;
            END IF;
            UPDATE queen.kv k SET value = to_jsonb(v_next), version = nextval('queen.kv_versions'), updated_at = now()
            WHERE k.ns = p_ns AND k.key = p_key
            RETURNING true, NULL::text, k.value, k.version, k.expires_at, k.updated_at INTO v;
            RETURN v;
        END IF;
        v_next := p_delta;
        IF v_next < p_min OR v_next > p_max THEN
            RETURN (false, 'limit', NULL, NULL, NULL, NULL)::queen.kv_verdict;
        END IF;
        -- Absent or expired: start from zero with this call's expiry. A
        -- concurrent creator makes the insert miss; look again.
        INSERT INTO queen.kv AS k (ns, key, value, version, expires_at)
        VALUES (p_ns, p_key, to_jsonb(v_next), nextval('queen.kv_versions'),
                CASE WHEN p_ttl IS NULL THEN NULL ELSE now() + make_interval(secs => p_ttl) END)
        ON CONFLICT (ns, key) DO UPDATE
            SET value = EXCLUDED.value, version = EXCLUDED.version, expires_at = EXCLUDED.expires_at,
                updated_at = now(), created_at = now()
            WHERE k.expires_at <= now()
        RETURNING true, NULL::text, k.value, k.version, k.expires_at, k.updated_at INTO v;
        IF FOUND THEN
            RETURN v;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'kv_incr_v1: % / % kept changing under the increment', p_ns, p_key;
END
$$;

-- Removes up to p_batch expired rows; the count removed.
CREATE FUNCTION queen.kv_sweep_v1(p_batch integer)
RETURNS bigint
LANGUAGE sql AS $$
    WITH doomed AS (
        SELECT ns, key FROM queen.kv WHERE expires_at <= now() ORDER BY expires_at LIMIT p_batch
    ), gone AS (
        DELETE FROM queen.kv k USING doomed d WHERE k.ns = d.ns AND k.key = d.key AND k.expires_at <= now() RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;
