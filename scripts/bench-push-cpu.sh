#!/usr/bin/env bash
# Where a pushed message's CPU goes, beside what the baseline spends per row
# (docs/PERFORMANCE.md, "Where each missed target is bound").
#
# Why: bench-push.sh gives ratios, and on a shared two-core machine they
# scatter. CPU per message by process says what bounds a ratio: when
# PostgreSQL alone spends more per message than the whole machine spends per
# baseline row, no broker work can reach the target.
#
# One private durable cluster: first pgbench (single-row INSERT commits with
# CLIENTS1 clients, 100-row INSERT commits with CLIENTS100), with the
# machine's busy CPU per row from /proc/stat; then a release broker and
# queen-bench push at batch 1, at batch 100 on a default queue, and at batch
# 100 on a window-0 queue as JSON and as QPB1 flag 8, each with the CPU of the
# broker, PostgreSQL and the load generator per message
# (scripts/lib/cpu-sample.py). Localhost only; DURATION seconds per step.
DURATION=${DURATION:-8}
CLIENTS1=${CLIENTS1:-32}
CLIENTS100=${CLIENTS100:-8}
PAYLOAD=${PAYLOAD:-100}
source "$(dirname "$0")/lib/bench-cluster.sh"

"${PSQL[@]}" -c "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload text NOT NULL)"
echo "INSERT INTO bench_rows (payload) VALUES (repeat('x', $PAYLOAD));" > "$DIR/single.sql"
echo "INSERT INTO bench_rows (payload) SELECT repeat('x', $PAYLOAD) FROM generate_series(1, 100);" > "$DIR/batch.sql"
busy_ticks() { awk 'NR == 1 { b = 0; for (i = 2; i <= NF; i++) if (i != 5 && i != 6) b += $i; print b }' /proc/stat; }
baseline() { # clients script rows-per-commit
    local b0 t0 tps b1 t1
    b0=$(busy_ticks); t0=$(date +%s.%N)
    tps=$("$BIN/pgbench" -h "$DIR" -p 5499 -U postgres -n -c "$1" -j 2 -T "$DURATION" -f "$DIR/$2.sql" postgres 2>&1 \
        | awk '/^tps/ { print $3 }')
    b1=$(busy_ticks); t1=$(date +%s.%N)
    python3 -c "
import os
busy = ($b1 - $b0) / os.sysconf('SC_CLK_TCK'); wall = $t1 - $t0; rows = float('$tps') * $3
print(f'baseline $2, $1 clients: {rows:.0f} rows/s, machine {busy / (wall * os.cpu_count()) * 100:.0f} % busy, '
      f'{busy / (rows * wall) * 1e6:.1f} us of machine CPU per row')"
}
echo "== pgbench on the same PostgreSQL"
baseline "$CLIENTS1" single 1
baseline "$CLIENTS100" batch 100

start_broker
OUT=$DIR/bench.out
sampled() { # label, then queen-bench push arguments
    local label=$1 pid cpu
    shift
    ./target/release/queen-bench --url "$BROKER_URL" push --duration "$DURATION" --payload-size "$PAYLOAD" "$@" > "$OUT" &
    pid=$!
    cpu=$(python3 scripts/lib/cpu-sample.py "$OUT" "$BROKER_PID")
    wait "$pid"
    echo "$label: $(grep '^push ' "$OUT" | awk '{ print $9 }') msg/s; $(echo "$cpu" | tail -1)"
}
echo "== broker: push, 10 partitions, CPU per message by process"
sampled "batch 1, $CLIENTS1 clients" --batch 1 --partitions 10 --concurrency "$CLIENTS1"
sampled "batch 100, $CLIENTS100 clients, default queue" --batch 100 --partitions 10 --concurrency "$CLIENTS100"
sampled "batch 100, window 0, JSON" --batch 100 --partitions 10 --concurrency "$CLIENTS100" --dedup-window 0
sampled "batch 100, window 0, QPB1" --batch 100 --partitions 10 --concurrency "$CLIENTS100" --dedup-window 0 --binary
stop_broker
