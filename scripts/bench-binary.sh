#!/usr/bin/env bash
# Binary wire formats against JSON in the same run (docs/PERFORMANCE.md):
# push at batch 100 as JSON and as QPB1 flag-8 groups (stored as they came),
# on a default queue and on one without a dedup window,
# then drain a backlog with autoAck pops as JSON and as QPF1 frames (decoded
# and sliced by the bench, as a client would), once with the default
# synchronous autoAck claims and once on a broker restarted with
# QUEEN_POP_AUTOACK_ASYNC_COMMIT=true (docs/DECISIONS.md). Durable private cluster,
# release broker, localhost only, bounded runs.
DURATION=${DURATION:-15}
MESSAGES=${MESSAGES:-1000000}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
echo "== push, batch 100, 10 partitions, 8 clients: JSON, then QPB1 flag 8"
for body in "" "--binary"; do
    ./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 \
        --duration "$DURATION" $body
done
echo "== the same on queues without a dedup window (no transaction index)"
for body in "" "--binary"; do
    ./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 \
        --duration "$DURATION" --dedup-window 0 $body
done
drains() {
    for mode in "--auto-ack" "--auto-ack --frames"; do
        ./target/release/queen-bench --url "$BROKER_URL" consume --messages "$MESSAGES" --partitions 10 --batch 500 \
            --concurrency 4 $mode
    done
}
echo "== consume $MESSAGES, autoAck, pop batch 500, 4 consumers: JSON, then QPF1 frames"
drains
echo "== the same, autoAck claims not waiting for the disk (QUEEN_POP_AUTOACK_ASYNC_COMMIT=true)"
stop_broker
QUEEN_POP_AUTOACK_ASYNC_COMMIT=true start_broker
drains
