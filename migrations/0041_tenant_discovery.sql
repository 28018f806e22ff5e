-- The discovery pop per tenant (issue 49): a pop by namespace or task
-- claims from the caller's tenant's queues only (queues.tenant_id, 0039);
-- labels are the tenant's own, so two tenants' queues of one namespace
-- never serve each other. The body is pop_discover_v1's (0003) with the
-- tenant as one more condition; v1 stays for brokers of the previous
-- version during a rolling upgrade.
CREATE FUNCTION queen.pop_discover_v2(
    p_tenant         uuid,
    p_namespace      text,
    p_task           text,
    p_group          text,
    p_worker         text,
    p_lease_seconds  integer,
    p_auto_ack       boolean,
    p_budget         integer,
    p_max_partitions integer,
    p_intent_mode    text,
    p_intent_from    timestamptz,
    p_cand_cap       integer)
RETURNS SETOF queen.pop_row
LANGUAGE plpgsql AS $$
DECLARE
    v_qids   bigint[];
    v_qid    bigint;
    v_cands  bigint[] := '{}';
BEGIN
    SELECT COALESCE(array_agg(q.id ORDER BY q.id), '{}') INTO v_qids FROM queen.queues q
    WHERE q.tenant_id = p_tenant
      AND (p_namespace IS NULL OR q.namespace = p_namespace) AND (p_task IS NULL OR q.task = p_task);
    FOREACH v_qid IN ARRAY v_qids LOOP
        PERFORM queen.register_group_v1(v_qid, p_group, p_intent_mode, p_intent_from);
        v_cands := v_cands || queen.pop_candidates_v1(v_qid, p_group, p_cand_cap);
    END LOOP;
    SELECT COALESCE(array_agg(x.id), '{}') INTO v_cands
    FROM (SELECT u.id FROM unnest(v_cands) AS u (id) ORDER BY random() LIMIT p_cand_cap) x;
    RETURN QUERY SELECT * FROM queen.pop_list_prefix_v1(v_cands, p_group, p_worker, p_lease_seconds, p_auto_ack,
                                                 p_budget, p_max_partitions, p_intent_mode, p_intent_from);
END
$$;
