#!/usr/bin/env bash
# Tenancy's cost (issue 49): push at batch 100 (8 clients, 10 partitions a
# queue) spread over 100 tenants, each its own queue (`push --tenants 100`,
# the broker with QUEEN_TENANCY_HEADER and QUEEN_TRUSTED_PROXY), beside the
# same spread over 100 queues of one tenant with tenancy off (`--queues
# 100`): the same number of queues and partitions, only the tenancy
# differs. Then the same for a leased drain (pop 100 over up to 4
# partitions + ack/batch, 8 consumers) of MESSAGES spread the same ways.
# CASES="push drain" picks. Alternating, ROUNDS rounds of DURATION seconds
# each, a fresh schema per run. Durable private cluster, release broker,
# localhost only.
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
TENANTS=${TENANTS:-100}
MESSAGES=${MESSAGES:-200000}
CASES=${CASES:-push drain}
source "$(dirname "$0")/lib/bench-cluster.sh"
BENCH=./target/release/queen-bench
fresh_schema() {
    "${PSQL[@]}" -c "SET client_min_messages = warning" -c "DROP SCHEMA queen CASCADE"
}
run() {  # $1: push | drain, $2: off | on
    local spread=(--queues "$TENANTS")
    if [ "$2" = on ]; then
        spread=(--tenants "$TENANTS")
        QUEEN_TENANCY_HEADER=true QUEEN_TRUSTED_PROXY=true start_broker
    else
        start_broker
    fi
    if [ "$1" = push ]; then
        "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" "${spread[@]}" \
            | sed "s/^push /push-tenancy-$2 /"
    else
        "$BENCH" --url "$BROKER_URL" consume --messages "$MESSAGES" --partitions 10 --batch 100 --pop-partitions 4 --concurrency 8 \
            --duration 120 "${spread[@]}" | sed "s/^consume /drain-tenancy-$2 /"
    fi
    stop_broker
    fresh_schema
}
for case in $CASES; do
    for round in $(seq 1 "$ROUNDS"); do
        if (( round % 2 )); then order="off on"; else order="on off"; fi
        for mode in $order; do run "$case" "$mode"; done
    done
done
