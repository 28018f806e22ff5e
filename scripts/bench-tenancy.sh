#!/usr/bin/env bash
# Tenancy's cost (issue 49): push at batch 100 (8 clients, 10 partitions a
# queue) spread over 100 tenants, each its own queue (`push --tenants 100`,
# the broker with QUEEN_TENANCY_HEADER and QUEEN_TRUSTED_PROXY), beside the
# same spread over 100 queues of one tenant with tenancy off (`--queues
# 100`): the same number of queues and partitions, only the tenancy
# differs. Alternating, ROUNDS rounds of DURATION seconds each, a fresh
# schema per run. Durable private cluster, release broker, localhost only.
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
TENANTS=${TENANTS:-100}
source "$(dirname "$0")/lib/bench-cluster.sh"
BENCH=./target/release/queen-bench
fresh_schema() {
    "${PSQL[@]}" -c "SET client_min_messages = warning" -c "DROP SCHEMA queen CASCADE"
}
run() {  # $1: off | on
    if [ "$1" = on ]; then
        QUEEN_TENANCY_HEADER=true QUEEN_TRUSTED_PROXY=true start_broker
        "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" --tenants "$TENANTS" | sed "s/^push /push-tenancy-on /"
    else
        start_broker
        "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" --queues "$TENANTS" | sed "s/^push /push-tenancy-off /"
    fi
    stop_broker
    fresh_schema
}
for round in $(seq 1 "$ROUNDS"); do
    if (( round % 2 )); then order="off on"; else order="on off"; fi
    for mode in $order; do run "$mode"; done
done
