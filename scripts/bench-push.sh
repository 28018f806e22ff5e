#!/usr/bin/env bash
# Push throughput of the broker beside the raw commit rates of the same
# PostgreSQL, measured in one run on one machine (docs/PERFORMANCE.md).
#
# Starts a private, durable cluster (default settings: fsync and synchronous
# commit on), a release broker on it, runs queen-bench at batch 1 with
# CLIENTS1 clients and at batch 100 with CLIENTS100 clients, then pgbench with
# the same payload size at the same client counts: single-row INSERT commits
# against batch 1, 100-row INSERT commits against batch 100 (run twice: on a
# default queue, and on one with dedupWindowSeconds 0, which keeps no
# transaction index). Everything on localhost; bounded by DURATION seconds per
# step.
DURATION=${DURATION:-20}
CLIENTS1=${CLIENTS1:-32}
CLIENTS100=${CLIENTS100:-8}
PARTITIONS=${PARTITIONS:-10}
PAYLOAD=${PAYLOAD:-100}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker

# PostgreSQL's commits so far in the broker's database (every backend's,
# background services included), read after the stats have been flushed.
commits() {
    sleep 1.5
    "${PSQL[@]}" -tAc "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
}

echo "== broker: push, $PARTITIONS partitions, ${PAYLOAD}-byte payloads"
before=$(commits)
out=$(./target/release/queen-bench --url "$BROKER_URL" push --batch 1 --partitions "$PARTITIONS" \
    --concurrency "$CLIENTS1" --duration "$DURATION" --payload-size "$PAYLOAD")
echo "$out"
after=$(commits)
messages=$(echo "$out" | sed -n 's/.*"messages":\([0-9]*\).*/\1/p')
per=$(awk -v c=$((after - before)) -v m="$messages" 'BEGIN { printf "%.3f", c / m }')
echo "PostgreSQL commits per pushed message at batch 1: $((after - before)) for $messages = $per"
echo "{\"scenario\":\"commits-per-message\",\"batch\":1,\"commits\":$((after - before)),\"messages\":$messages,\"per_message\":$per}"
./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions "$PARTITIONS" \
    --concurrency "$CLIENTS100" --duration "$DURATION" --payload-size "$PAYLOAD"
# The same on a queue without a dedup window (no transaction index).
./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions "$PARTITIONS" \
    --concurrency "$CLIENTS100" --duration "$DURATION" --payload-size "$PAYLOAD" --dedup-window 0
stop_broker

echo "== baseline: pgbench on the same PostgreSQL"
"${PSQL[@]}" -c "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload text NOT NULL)"
echo "INSERT INTO bench_rows (payload) VALUES (repeat('x', $PAYLOAD));" > "$DIR/single.sql"
echo "INSERT INTO bench_rows (payload) SELECT repeat('x', $PAYLOAD) FROM generate_series(1, 100);" > "$DIR/batch.sql"
chmod a+r "$DIR"/*.sql
pgbench_tps() { # clients script
    "$BIN/pgbench" -h "$DIR" -p 5499 -U postgres -n -c "$1" -j 2 -T "$DURATION" -f "$DIR/$2.sql" postgres 2>&1 \
        | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
tps=$(pgbench_tps "$CLIENTS1" single)
echo "baseline single-row INSERT commits/s, $CLIENTS1 clients: $tps"
echo "{\"scenario\":\"baseline-single-row\",\"clients\":$CLIENTS1,\"commits_per_s\":$tps}"
tps=$(pgbench_tps "$CLIENTS100" batch)
rows=$(awk -v t="$tps" 'BEGIN { printf "%.0f", t * 100 }')
echo "baseline 100-row INSERT batches, $CLIENTS100 clients: $tps commits/s = $rows rows/s"
echo "{\"scenario\":\"baseline-100-row\",\"clients\":$CLIENTS100,\"commits_per_s\":$tps,\"rows_per_s\":$rows}"
