#!/usr/bin/env bash
# Traces in a consume loop (docs/PERFORMANCE.md): a client-shaped loop
# (CONSUMERS consumers, leased pops of BATCH, ack/batch) draining MESSAGES
# messages, with and without one awaited POST /api/v1/traces per message
# before the ack; the two alternate within each of ROUNDS rounds, each on a
# fresh queue, with the CPU seconds per message of the broker, PostgreSQL
# and the load generator (scripts/lib/cpu-sample.py, after the prefill).
# Durable private cluster, release broker, localhost only.
MESSAGES=${MESSAGES:-20000}
CONSUMERS=${CONSUMERS:-16}
BATCH=${BATCH:-1}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
OUT=$DIR/bench.out
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    for trace in "" "--trace"; do
        ./target/release/queen-bench --url "$BROKER_URL" consume --messages "$MESSAGES" --batch "$BATCH" \
            --concurrency "$CONSUMERS" --partitions "${PARTITIONS:-$CONSUMERS}" --pop-partitions 1 $trace > "$OUT" &
        pid=$!
        cpu=$(python3 scripts/lib/cpu-sample.py "$OUT" "$BROKER_PID" --after prefilled)
        wait "$pid"
        grep '^{' "$OUT"
        echo "$cpu"
    done
done
