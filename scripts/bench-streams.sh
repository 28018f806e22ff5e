#!/usr/bin/env bash
# The streams runtime (docs/PERFORMANCE.md, issue 30): MESSAGES messages over
# 20 partitions summed in a tumbling window the way the clients' processor
# drives the broker (leased pop, state read, one /streams/v1/cycle per
# batch), then a plain leased consume (pop + ack/batch) of as many messages,
# in each of ROUNDS rounds; with the CPU seconds per message of the broker,
# PostgreSQL and the load generator for each side (scripts/lib/cpu-sample.py,
# after the prefill). Durable private cluster, release broker, localhost
# only, each step bounded.
MESSAGES=${MESSAGES:-100000}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
OUT=$DIR/bench.out
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    rates=()
    for side in stream plain; do
        ./target/release/queen-bench --url "$BROKER_URL" streams --messages "$MESSAGES" --partitions 20 --only "$side" > "$OUT" &
        pid=$!
        cpu=$(python3 scripts/lib/cpu-sample.py "$OUT" "$BROKER_PID" --after prefilled)
        wait "$pid"
        line=$(grep '"scenario":"streams"' "$OUT")
        rate=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(round(d["stream_msg_per_s"] or d["plain_msg_per_s"]))' "$line")
        rates+=("$rate")
        echo "$side: $rate msg/s"
        echo "$cpu"
    done
    python3 -c 'import sys; s, p = map(float, sys.argv[1:]); print(f"ratio {s / p:.2f}")' "${rates[@]}"
done
