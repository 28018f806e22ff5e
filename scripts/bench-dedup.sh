#!/usr/bin/env bash
# Push with deduplication, the path users take (issue 34, docs/PERFORMANCE.md):
# batch 100, 8 clients, PARTITIONS partitions, client-minted random v4
# transactionIds on a queue with the default window (WINDOW seconds, 3600),
# beside the same on a window-0 queue, and both with broker-minted ids,
# interleaved for ROUNDS rounds on one broker, each with CPU per message by
# process and WAL bytes per message; then the 100-row INSERT baseline of the
# same PostgreSQL. Durable private cluster, release broker, localhost only,
# bounded runs.
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
PARTITIONS=${PARTITIONS:-10}
WINDOW=${WINDOW:-3600}
# PRELOAD index entries spread over the window, written before the rounds
# into the partitions of the queue the windowed client-id runs push to: the
# index a long window holds in its steady state, which a 10 s run never
# grows on its own.
PRELOAD=${PRELOAD:-0}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
source scripts/lib/sampled.sh
push() { sampled push --batch 100 --partitions "$PARTITIONS" --concurrency 8 --duration "$DURATION" "$@"; }
QUEUE=bench.dedup.windowed
./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions "$PARTITIONS" --concurrency 8 --duration 1 \
    --dedup-window "$WINDOW" --queue "$QUEUE" > /dev/null
if [ "$PRELOAD" -gt 0 ]; then
    echo "== preloading $PRELOAD index entries over the last $WINDOW s"
    "${PSQL[@]}" -c "INSERT INTO queen.txn_index (partition_id, txn_hash, msg_offset, created_at)
        SELECT p.id, (random() * 9.2e18)::bigint * (CASE WHEN random() < 0.5 THEN -1 ELSE 1 END), -g,
               now() - random() * make_interval(secs => $WINDOW)
        FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id AND q.name = '$QUEUE'
        CROSS JOIN generate_series(1, $PRELOAD / $PARTITIONS) g
        ON CONFLICT DO NOTHING" -c "CHECKPOINT"
fi
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round: client-minted ids, window $WINDOW s"
    push --dedup-window "$WINDOW" --queue "$QUEUE"
    echo "== round $round: client-minted ids, window 0"
    push --dedup-window 0
    echo "== round $round: broker-minted ids, window $WINDOW s"
    push --dedup-window "$WINDOW" --ids broker
    echo "== round $round: broker-minted ids, window 0"
    push --dedup-window 0 --ids broker
done
"${PSQL[@]}" -c "SELECT relname, pg_size_pretty(pg_relation_size(oid)) AS heap,
                         pg_size_pretty(pg_relation_size(reltoastrelid)) AS toast,
                         pg_size_pretty(pg_indexes_size(oid)) AS indexes
                  FROM pg_class WHERE relnamespace = 'queen'::regnamespace AND relname IN ('segments', 'txn_index')"
stop_broker
echo "== baseline: 100-row INSERT commits, 8 clients, on the same PostgreSQL"
"${PSQL[@]}" -c "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload text NOT NULL)"
echo "INSERT INTO bench_rows (payload) SELECT repeat('x', 100) FROM generate_series(1, 100);" > "$DIR/batch.sql"
chmod a+r "$DIR/batch.sql"
for round in $(seq 1 "$ROUNDS"); do
    tps=$("$BIN/pgbench" -h "$DIR" -p 5499 -U postgres -n -c 8 -j 2 -T "$DURATION" -f "$DIR/batch.sql" postgres 2>&1 \
        | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    echo "baseline round $round: $(awk -v t="$tps" 'BEGIN { printf "%.0f", t * 100 }') rows/s"
done
