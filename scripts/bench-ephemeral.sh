#!/usr/bin/env bash
# Ephemeral queues (docs/PERFORMANCE.md, issue 33): MESSAGES 100-byte
# messages pushed at batch 100 by 8 clients into an ephemeral queue, then into
# a durable one; the broker's RSS growth while the ephemeral ones are queued;
# both drained with pops of 100 and one ack request per pop; then 200 parked
# ephemeral pops each woken by a push. ROUNDS rounds, each on a fresh broker
# (so the RSS growth is not memory an earlier round freed) with a 2 GiB
# ephemeral budget. Durable private cluster, release broker, localhost only,
# each step bounded.
MESSAGES=${MESSAGES:-1000000}
ROUNDS=${ROUNDS:-3}
export QUEEN_EPHEMERAL_MAX_MB=${QUEEN_EPHEMERAL_MAX_MB:-2048}
source "$(dirname "$0")/lib/bench-cluster.sh"
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    start_broker
    ./target/release/queen-bench --url "$BROKER_URL" ephemeral --messages "$MESSAGES"
    stop_broker
done
