#!/usr/bin/env bash
# Push throughput of the broker beside the raw commit rates of the same
# PostgreSQL, measured in one run on one machine (docs/PERFORMANCE.md).
#
# Starts a private, durable cluster (default settings: fsync and synchronous
# commit on), a release broker on it, runs queen-bench, then pgbench with the
# same payload size and client count. Everything on localhost; bounded by
# DURATION seconds per step.
DURATION=${DURATION:-20}
CLIENTS=${CLIENTS:-8}
PARTITIONS=${PARTITIONS:-10}
PAYLOAD=${PAYLOAD:-100}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker

echo "== broker: push, batch 1 and batch 100, $PARTITIONS partitions, $CLIENTS clients, ${PAYLOAD}-byte payloads"
./target/release/queen-bench --url "$BROKER_URL" push --batch 1 --partitions "$PARTITIONS" \
    --concurrency "$CLIENTS" --duration "$DURATION" --payload-size "$PAYLOAD"
./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions "$PARTITIONS" \
    --concurrency "$CLIENTS" --duration "$DURATION" --payload-size "$PAYLOAD"
stop_broker

echo "== baseline: pgbench on the same PostgreSQL, $CLIENTS clients"
"${PSQL[@]}" -c "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload text NOT NULL)"
echo "INSERT INTO bench_rows (payload) VALUES (repeat('x', $PAYLOAD));" > "$DIR/single.sql"
echo "INSERT INTO bench_rows (payload) SELECT repeat('x', $PAYLOAD) FROM generate_series(1, 100);" > "$DIR/batch.sql"
chmod a+r "$DIR"/*.sql
for f in single batch; do
    out=$("$BIN/pgbench" -h "$DIR" -p 5499 -U postgres -n -c "$CLIENTS" -j 2 -T "$DURATION" -f "$DIR/$f.sql" postgres 2>&1)
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    if [ "$f" = single ]; then
        echo "baseline single-row INSERT commits/s: $tps"
        echo "{\"scenario\":\"baseline-single-row\",\"clients\":$CLIENTS,\"commits_per_s\":$tps}"
    else
        rows=$(awk -v t="$tps" 'BEGIN { printf "%.0f", t * 100 }')
        echo "baseline 100-row INSERT batches: $tps commits/s = $rows rows/s"
        echo "{\"scenario\":\"baseline-100-row\",\"clients\":$CLIENTS,\"commits_per_s\":$tps,\"rows_per_s\":$rows}"
    fi
done
