-- An owner's retried acquire gets its one permit back (issue 44 §4).
--
-- lock_acquire_v1 looked for the owner's permit once, in the snapshot the
-- call started with, then skipped every slot it saw held and raced for the
-- free ones. A retry that arrives while the original acquire is still in
-- flight (the client gave up on a lost reply) passed that first look, then
-- met the original's new row: a lock answered the owner `held` by itself,
-- a semaphore handed the same owner a second permit. Now every slot it
-- meets held, seen at once or lost in the putIfAbsent race, is looked at
-- again for this owner: each statement of a PL/pgSQL function reads the
-- latest committed rows, so the original's permit is found and answered
-- with `o_already` and its own token.
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
        -- Slots held in this snapshot are skipped without a lock, unless
        -- this owner holds them.
        SELECT false, 'exists', k.value, k.version, k.expires_at, k.updated_at INTO v
        FROM queen.kv_live_v1('queen-locks', p_name || '#' || s, false) k;
        IF NOT FOUND THEN
            v := queen.kv_put_v1('queen-locks', p_name || '#' || s, jsonb_build_object('owner', p_owner), p_ttl, 0);
            IF v.applied THEN
                RETURN QUERY SELECT s, v.version, false, v.expires_at;
                RETURN;
            END IF;
        END IF;
        -- Held: by this owner (its own acquire, committed meanwhile), or not.
        IF v.value->>'owner' = p_owner THEN
            RETURN QUERY SELECT s, v.version, true, v.expires_at;
            RETURN;
        END IF;
    END LOOP;
END
$$;
