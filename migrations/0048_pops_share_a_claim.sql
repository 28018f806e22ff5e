-- Pops of one partition at a time share a claim's transaction (issue 46).
--
-- A consumer loop of pop batch 1 + ack per message, the clients' default,
-- paid a claim statement and its commit for every message: over 100
-- partitions, 32 consumers, 1.13 PostgreSQL commits per message, and
-- queen.pop_list_v1 was three quarters of PostgreSQL's time. Pops that reach
-- the broker while such a claim is in flight now go to PostgreSQL together
-- (src/pop/share.rs): one call of this function, one transaction, one
-- commit, and each pop answered with its own rows.
--
-- Each pop is a slot: its candidates (the hot-list ring checked them out
-- for it alone, so no two slots share a partition) and its own parameters,
-- worker (lease id) included. The function claims slot by slot through
-- queen.pop_list_v1, exactly as that pop's own call would, and tags every
-- row with its slot. The claim rules do not change: claim-first with SKIP
-- LOCKED, one lease per partition and group, the same rows.
--
-- p_ends: where each slot's candidates end in p_pids (slot i holds
-- p_pids[p_ends[i-1] + 1 .. p_ends[i]]). The other arrays hold one value
-- per slot.
CREATE FUNCTION queen.pop_list_shared_v1(
    p_ends           integer[],
    p_pids           bigint[],
    p_groups         text[],
    p_workers        text[],
    p_lease_seconds  integer[],
    p_auto_ack       boolean[],
    p_budgets        integer[],
    p_max_partitions integer[],
    p_intent_modes   text[],
    p_intent_froms   timestamptz[])
RETURNS TABLE (o_slot integer, o_partition_id bigint, o_partition text, o_queue text, o_kind text,
               o_base_offset bigint, o_start_idx integer, o_take integer, o_created_at timestamptz,
               o_blob bytea, o_first bigint, o_last bigint, o_attempt integer, o_msg_count integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_from integer := 1;
BEGIN
    FOR i IN 1..COALESCE(cardinality(p_ends), 0) LOOP
        RETURN QUERY SELECT i, r.* FROM queen.pop_list_v1(
            p_pids[v_from:p_ends[i]], p_groups[i], p_workers[i], p_lease_seconds[i], p_auto_ack[i],
            p_budgets[i], p_max_partitions[i], p_intent_modes[i], p_intent_froms[i]) r;
        v_from := p_ends[i] + 1;
    END LOOP;
END
$$;
