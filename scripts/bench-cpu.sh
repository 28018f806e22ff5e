#!/usr/bin/env bash
# CPU by process per message (docs/PERFORMANCE.md, "Where a drain's and a
# push's CPU goes"): a window-0 push at batch 100 as JSON and as QPB1 flag 8,
# then autoAck drains of a MESSAGES backlog as JSON and as QPF1 frames, each
# with the CPU seconds of the broker, PostgreSQL and the load generator
# (scripts/lib/cpu-sample.py; a drain is sampled after its prefill). Run it
# with QUEEN_BIN set to compare builds, each on a fresh cluster. Durable
# private cluster, release broker, localhost only, bounded runs.
DURATION=${DURATION:-8}
MESSAGES=${MESSAGES:-3000000}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
OUT=$DIR/bench.out
sampled() { # args: queen-bench arguments; the sampler waits for $AFTER when set
    ./target/release/queen-bench --url "$BROKER_URL" "$@" > "$OUT" &
    local pid=$!
    local cpu
    cpu=$(python3 scripts/lib/cpu-sample.py "$OUT" "$BROKER_PID" ${AFTER:+--after "$AFTER"})
    wait "$pid"
    cat "$OUT"
    echo "$cpu"
}
echo "== push, window 0, batch 100, 10 partitions, 8 clients: JSON, then QPB1 flag 8"
for body in "" "--binary"; do
    sampled push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" --dedup-window 0 $body
done
echo "== consume $MESSAGES, autoAck, pop batch 500, 4 consumers: JSON, then QPF1 frames (after the prefill)"
for mode in "--auto-ack" "--auto-ack --frames"; do
    AFTER=prefilled sampled consume --messages "$MESSAGES" --partitions 10 --batch 500 --concurrency 4 $mode
done
