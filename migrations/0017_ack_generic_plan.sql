-- The bulk ack keeps one plan instead of planning each call.
--
-- A one-partition ack batch now goes through ack_completed_many_v1 too (a
-- plain group alone; ack_v1 walks its items one by one). With one-element
-- arrays PL/pgSQL's plan cache judges a custom plan cheaper than the generic
-- one (which assumes ten rows per unnest), so both of the function's
-- statements were planned again on every call: 273 µs of a 428 µs call in a
-- 10-partition drain (pg_stat_statements with track_planning, stop 13). The
-- generic plan is the one the custom plans come to anyway: index probes of
-- the cursor rows, one per group.
ALTER FUNCTION queen.ack_completed_many_v1(text, bigint[], text[], bigint[], bigint[])
    SET plan_cache_mode = force_generic_plan;
