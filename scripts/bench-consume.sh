#!/usr/bin/env bash
# Consumption and end-to-end latency (docs/PERFORMANCE.md): push at batch 100
# (the figure issue 7 compares consumption with, measured in the same run),
# drain a pre-filled backlog with leased pops + ack/batch and with autoAck,
# then producers at a fixed rate with long-poll consumers, while a probe times
# the disk's own fdatasync in the same window (the bound on a durable push's
# tail). Durable private cluster, release broker.
MESSAGES=${MESSAGES:-200000}
E2E_RATE=${E2E_RATE:-20000}
DURATION=${DURATION:-20}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
echo "== broker: push, batch 100, 10 partitions, 8 clients (the figure consumption is compared with)"
./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION"
echo "== broker: consume $MESSAGES messages, 10 partitions, pop batch 500, 4 consumers"
./target/release/queen-bench --url "$BROKER_URL" consume --messages "$MESSAGES" --partitions 10 --batch 500 --concurrency 4
./target/release/queen-bench --url "$BROKER_URL" consume --messages "$MESSAGES" --partitions 10 --batch 500 --concurrency 4 --auto-ack
echo "== broker: e2e at $E2E_RATE msg/s, batch 100, long-poll consumers; the disk's fdatasync in the same window"
./target/release/queen-bench --url "$BROKER_URL" e2e --rate "$E2E_RATE" --batch 100 --partitions 10 --consumers 4 --duration "$DURATION" \
    --fsync-probe "$DIR"
