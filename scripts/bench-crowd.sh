#!/usr/bin/env bash
# Many consumers (docs/PERFORMANCE.md): a leased drain of MESSAGES over
# PARTITIONS partitions by 4 and by CROWD consumers, with the adaptive claim
# permits (db::limiter) and with them fixed at three quarters of the pool
# (QUEEN_POP_ADAPTIVE_PERMITS=false), alternating ROUNDS times on one cluster.
# Prints the permit limit each run ended at. Localhost only, bounded runs.
MESSAGES=${MESSAGES:-1000000}
PARTITIONS=${PARTITIONS:-100}
CROWD=${CROWD:-128}
ROUNDS=${ROUNDS:-2}
source "$(dirname "$0")/lib/bench-cluster.sh"
for round in $(seq 1 "$ROUNDS"); do
    for adaptive in true false; do
        echo "== round $round, QUEEN_POP_ADAPTIVE_PERMITS=$adaptive"
        export QUEEN_POP_ADAPTIVE_PERMITS=$adaptive
        start_broker
        for consumers in 4 "$CROWD"; do
            ./target/release/queen-bench --url "$BROKER_URL" consume --messages "$MESSAGES" --partitions "$PARTITIONS" \
                --batch 500 --concurrency "$consumers"
            curl -s "$BROKER_URL/metrics/prometheus" | grep '^queen_pop_permit_limit' || true
        done
        stop_broker
    done
done
