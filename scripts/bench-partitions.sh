#!/usr/bin/env bash
# Many partitions in one queue against few, in one run (issue 7's target:
# within 20 % of the 10-partition figures; docs/PERFORMANCE.md).
#
# Push at batch 100 with 8 clients to 10 partitions and to PARTITIONS_MANY
# (each request to the next partition, so at 100,000 every request creates
# one), then drain a MESSAGES backlog spread over 10 and over PARTITIONS_MANY
# partitions with leased pops of POP_BATCH (500) over up to 50 partitions and
# ack/batch, 4 consumers (the issue's row says "at batch 100": POP_BATCH=100
# drains that way). Private durable cluster on localhost; every step bounded.
DURATION=${DURATION:-15}
POP_BATCH=${POP_BATCH:-500}
PARTITIONS_MANY=${PARTITIONS_MANY:-100000}
MESSAGES=${MESSAGES:-1000000}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker

for parts in 10 "$PARTITIONS_MANY"; do
    ./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions "$parts" \
        --concurrency 8 --duration "$DURATION"
done
for parts in 10 "$PARTITIONS_MANY"; do
    ./target/release/queen-bench --url "$BROKER_URL" consume --messages "$MESSAGES" --partitions "$parts" \
        --batch "$POP_BATCH" --pop-partitions 50 --concurrency 4
done
stop_broker
