#!/usr/bin/env bash
# Long-poll wake latency (docs/PERFORMANCE.md): a pop parked on an idle queue,
# one push, time until the pop's answer; TRIALS times, on a durable private
# cluster with a release broker. Then the revisit wheel's two scenarios: a
# queue with delayedProcessing 1 s (latency from the message's visibility
# time; VISIBILITY_TRIALS times, each a second long) and a queue with
# windowBuffer 2 s whose pushes carry a whole batch (the hold should end as
# the batch lands).
TRIALS=${TRIALS:-200}
VISIBILITY_TRIALS=${VISIBILITY_TRIALS:-50}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
echo "== broker: long-poll wake latency, $TRIALS trials"
./target/release/queen-bench --url "$BROKER_URL" wake --trials "$TRIALS"
echo "== broker: a delayed message's wake, delayedProcessing 1 s, $VISIBILITY_TRIALS trials"
./target/release/queen-bench --url "$BROKER_URL" wake --trials "$VISIBILITY_TRIALS" --delayed-s 1
echo "== broker: a window hold with a full batch, windowBuffer 2 s, $TRIALS trials"
./target/release/queen-bench --url "$BROKER_URL" wake --trials "$TRIALS" --window-s 2
