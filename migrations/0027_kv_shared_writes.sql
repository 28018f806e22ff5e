-- Single KV writes of concurrent calls in one statement (issue 46,
-- src/kv/share.rs). The shared write used to send one statement per call,
-- pipelined in one transaction: one executor start, parse of the bind and
-- function call per call. It now sends one statement that calls this
-- function once per call, in (ns, key) order, from a lateral join over the
-- calls' arrays.
--
-- Invariants: the verdict of each operation is the one its own function
-- gives (queen.kv_put_v1, queen.kv_delete_v1, queen.kv_incr_v1 of
-- migration 0010), computed under the row's lock; the calls run one after
-- another in the order given, so two shared writes lock their rows in the
-- same order and cannot deadlock each other; an operation this does not
-- know raises, and the broker runs the calls alone.
CREATE FUNCTION queen.kv_write_v1(p_op text, p_ns text, p_key text, p_value jsonb, p_ttl integer, p_expect bigint,
                                  p_delta numeric, p_min numeric, p_max numeric)
RETURNS queen.kv_verdict
LANGUAGE plpgsql AS $$
BEGIN
    CASE p_op
        WHEN 'put' THEN RETURN queen.kv_put_v1(p_ns, p_key, p_value, p_ttl, p_expect);
        WHEN 'delete' THEN RETURN queen.kv_delete_v1(p_ns, p_key, p_expect);
        WHEN 'incr' THEN RETURN queen.kv_incr_v1(p_ns, p_key, p_delta, p_min, p_max, p_ttl);
    END CASE;
END
$$;
