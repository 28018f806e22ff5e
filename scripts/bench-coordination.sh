#!/usr/bin/env bash
# KV, locks and timers under load (docs/PERFORMANCE.md, issue 29): single
# KV puts and gets and 100-put batches (CLIENTS clients, DURATION s each)
# beside pgbench's single-row INSERT commits at the same client count on the
# same PostgreSQL; lock acquire/release cycles with 32 contenders (a refused one retries after 10 ms) on one lock
# and on 1,000; TIMERS timers due over SPREAD s drained as they fire
# (lateness, duplicates); and push at batch 100 with and without 1,000,000
# pending timers, alternating. ROUNDS rounds of each. Durable private
# cluster, release broker, localhost only, every step bounded.
DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-32}
ROUNDS=${ROUNDS:-3}
TIMERS=${TIMERS:-100000}
SPREAD=${SPREAD:-10}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
BENCH=(./target/release/queen-bench --url "$BROKER_URL")
"${PSQL[@]}" -c "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload text NOT NULL)"
echo "INSERT INTO bench_rows (payload) VALUES (repeat('x', 40));" > "$DIR/single.sql"
chmod a+r "$DIR"/*.sql
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    for mode in put get batch; do
        "${BENCH[@]}" kv --mode "$mode" --concurrency "$CLIENTS" --duration "$DURATION" | grep '^{'
    done
    tps=$("$BIN/pgbench" -h "$DIR" -p 5499 -U postgres -n -c "$CLIENTS" -j 2 -T "$DURATION" -f "$DIR/single.sql" postgres 2>&1 \
        | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    echo "{\"scenario\":\"baseline-single-row\",\"clients\":$CLIENTS,\"commits_per_s\":$tps}"
    "${BENCH[@]}" locks --contenders 32 --locks 1 --retry-ms 10 --duration "$DURATION" | grep '^{'
    "${BENCH[@]}" locks --contenders 32 --locks 1000 --retry-ms 10 --duration "$DURATION" | grep '^{'
done
for round in $(seq 1 "$ROUNDS"); do
    echo "== timers round $round"
    "${BENCH[@]}" timers --count "$TIMERS" --start 15 --spread "$SPREAD" | grep '^{'
done
for round in $(seq 1 "$ROUNDS"); do
    echo "== push with and without 1,000,000 pending timers, round $round"
    "${PSQL[@]}" -c "DELETE FROM queen.timers"
    "${BENCH[@]}" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" | grep '^{' | sed 's/^{/{"pending_timers":0,/'
    "${PSQL[@]}" -c "INSERT INTO queen.timers (queue, timer_key, partition, payload, txn, message_id, deliver_at)
        SELECT 'bench.far', 'k' || g, 'Default', '1', 't' || g, gen_random_uuid(), now() + interval '1 day'
        FROM generate_series(1, 1000000) g" -c "ANALYZE queen.timers"
    "${BENCH[@]}" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" | grep '^{' | sed 's/^{/{"pending_timers":1000000,/'
done
