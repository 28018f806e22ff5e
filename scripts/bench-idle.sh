#!/usr/bin/env bash
# Idle cost (docs/PERFORMANCE.md): CONSUMERS parked long-polls on as many
# queues; broker CPU, RSS and database connections while nothing happens.
CONSUMERS=${CONSUMERS:-10000}
DURATION=${DURATION:-30}
export QUEEN_MAX_CONNECTIONS=$((CONSUMERS + 1000)) QUEEN_MAX_INFLIGHT_POP=$((CONSUMERS + 1000))
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
echo "== broker: $CONSUMERS parked long-polls for ${DURATION}s"
./target/release/queen-bench --url "$BROKER_URL" idle --consumers "$CONSUMERS" --duration "$DURATION"
