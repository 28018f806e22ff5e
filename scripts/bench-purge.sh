#!/usr/bin/env bash
# What the dedup purge's due check costs against a long history
# (docs/PERFORMANCE.md, stop 7). Builds a synthetic history in a private
# cluster: PARTITIONS partitions in 10 queues, SEGMENTS segments each for the
# first 100 per queue, all older than the default window and already purged
# (marks at the end), and one queue whose partitions have nothing new. Then
# times the broker's due-check statement with EXPLAIN ANALYZE, RUNS times.
PARTITIONS=${PARTITIONS:-1000}
SEGMENTS=${SEGMENTS:-1000}
RUNS=${RUNS:-5}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker # applies the schema
stop_broker
"${PSQL[@]}" -c "INSERT INTO queen.queues (name) SELECT 'purge.q' || g FROM generate_series(0, 9) g" \
    -c "INSERT INTO queen.partitions (queue_id, name, last_offset)
        SELECT q.id, 'p' || g, $SEGMENTS FROM queen.queues q CROSS JOIN generate_series(1, $PARTITIONS / 10) g" \
    -c "INSERT INTO queen.segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
        SELECT p.id, g, g, 1, now() - interval '2 hours' + g * interval '1 ms', '\x00'::bytea
        FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
        CROSS JOIN generate_series(1, $SEGMENTS) g
        WHERE q.name <> 'purge.q0' AND substr(p.name, 2)::int <= 100" \
    -c "INSERT INTO queen.dedup_purge_marks SELECT id, last_offset + 1, NULL FROM queen.partitions" \
    -c "VACUUM ANALYZE" >/dev/null
"${PSQL[@]}" -At -c "SELECT 'segments', count(*) FROM queen.segments" -c "SELECT 'partitions', count(*) FROM queen.partitions"
# The statement as the broker sends it (src/maintenance/dedup_purge.rs, DUE_SQL).
DUE=$(sed -n '/^const DUE_SQL/,/";$/p' src/maintenance/dedup_purge.rs | sed '1s/.*"$//; s/";$//; s/\$1/1000/')
for _ in $(seq 1 "$RUNS"); do
    "${PSQL[@]}" -At -c "EXPLAIN (ANALYZE, FORMAT JSON) $DUE" |
        python3 -c "import json, sys; print('due check ms', json.load(sys.stdin)[0]['Execution Time'])"
done
