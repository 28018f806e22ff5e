#!/usr/bin/env bash
# The streams runtime (docs/PERFORMANCE.md, issue 30): MESSAGES messages over
# 20 partitions summed in a tumbling window the way the clients' processor
# drives the broker (leased pop, state read, one /streams/v1/cycle per
# batch), beside a plain leased consume (pop + ack/batch) of as many messages
# in the same run; ROUNDS rounds. Durable private cluster, release broker,
# localhost only, each step bounded.
MESSAGES=${MESSAGES:-100000}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    ./target/release/queen-bench --url "$BROKER_URL" streams --messages "$MESSAGES" --partitions 20 | grep '"scenario":"streams"'
done
