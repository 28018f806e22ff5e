-- Transactional ids outlive idle producers (issue 48, docs/KAFKA.md).
--
-- Kafka forgets an idle idempotent producer after producer.id.expiration.ms
-- (one day) but a transactional id only after transactional.id.expiration.ms
-- (seven days): a stream processor stopped over a weekend comes back to
-- the same id, its epoch and its fencing intact. 0036's expiry had one
-- idleness for both; this one takes the two apart. A producer inside an
-- open transaction is never expired: the transaction times out first
-- (queen.kafka_txn_expire_v1) and only then may the id go.

CREATE FUNCTION queen.kafka_producers_expire_v2(p_idle_seconds bigint, p_txn_idle_seconds bigint, p_batch integer)
RETURNS bigint
LANGUAGE sql AS $$
    WITH idle AS (
        SELECT producer_id FROM queen.kafka_producers
        WHERE txn_state = 0
          AND touched_at < now() - make_interval(secs => CASE WHEN transactional_id IS NULL
                                                              THEN p_idle_seconds ELSE p_txn_idle_seconds END)
        LIMIT p_batch FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM queen.kafka_producers p USING idle WHERE p.producer_id = idle.producer_id RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;
