#!/usr/bin/env bash
# Fan-out (docs/PERFORMANCE.md): G consumer groups each read every message of
# one queue while producers push it, beside one group draining a backlog of
# the same size in the same run (the figure the groups share a log against).
# Durable private cluster, release broker, localhost only, bounded runs.
MESSAGES=${MESSAGES:-300000}
FANOUT_GROUPS=${FANOUT_GROUPS:-4}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
echo "== baseline of this run: one group drains $MESSAGES messages (leased, pop batch 500, ack/batch)"
./target/release/queen-bench --url "$BROKER_URL" consume --messages "$MESSAGES" --partitions 10 --batch 500 --concurrency 4
echo "== broker: fanout, $MESSAGES messages pushed at batch 100 by 2 producers, $FANOUT_GROUPS groups x 2 long-poll consumers"
./target/release/queen-bench --url "$BROKER_URL" fanout --messages "$MESSAGES" --batch 100 --partitions 10 \
    --producers 2 --groups "$FANOUT_GROUPS" --consumers 2
