#!/usr/bin/env bash
# Long-poll wake latency (docs/PERFORMANCE.md): a pop parked on an idle queue,
# one push, time until the pop's answer; TRIALS times, on a durable private
# cluster with a release broker.
TRIALS=${TRIALS:-200}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
echo "== broker: long-poll wake latency, $TRIALS trials"
./target/release/queen-bench --url "$BROKER_URL" wake --trials "$TRIALS"
