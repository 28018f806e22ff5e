-- Two functions keep their generic plans instead of planning each call.
--
-- PL/pgSQL's plan cache plans a statement afresh while a custom plan looks
-- cheaper than the generic one, and with short arrays it always does (the
-- generic plan assumes ten rows per unnest). pg_stat_statements with
-- track_planning showed two functions planned on every call (stop 13):
--
-- * ack_completed_many_v1: a one-partition ack batch now goes through it (a
--   plain group alone; ack_v1 walks its items one by one), and with
--   one-element arrays both of its statements were planned every call,
--   273 µs of a 428 µs call in a 10-partition drain;
-- * push_segments_v1: its segment insert, 47–76 µs a call, in every group
--   commit of several partitions.
--
-- In both, the generic plan is the one the custom plans come to anyway:
-- index probes per row, a function scan feeding an insert.
ALTER FUNCTION queen.ack_completed_many_v1(text, bigint[], text[], bigint[], bigint[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.push_segments_v1(text, text[], integer[], bytea[], integer[], integer[], bigint[])
    SET plan_cache_mode = force_generic_plan;
