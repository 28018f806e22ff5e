#!/usr/bin/env bash
# Reads by offset (docs/PERFORMANCE.md): MESSAGES messages pre-filled into
# one partition, read to the high watermark with POST /api/v1/fetch (8 MiB
# per call), then drained from the same partition with leased pops of 500 +
# ack/batch; ROUNDS times, each on a fresh queue. Durable private cluster,
# release broker, localhost only.
MESSAGES=${MESSAGES:-1000000}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    ./target/release/queen-bench --url "$BROKER_URL" fetch --messages "$MESSAGES"
done
