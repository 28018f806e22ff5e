#!/usr/bin/env bash
# Several brokers on one database (docs/PERFORMANCE.md, issue 32): three
# brokers; 200 long-polls parked on broker B, each woken by one push through
# broker A (from the push's 201 to the pop's answer); then push at batch 100
# (8 clients, DURATION s) through A with B and C listening, with the push
# hints on and off (all three restarted with QUEEN_PEER_HINTS=false),
# alternating, ROUNDS rounds. Durable private cluster, release brokers,
# localhost only.
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/lib/bench-cluster.sh"
PEERS=()
start_three() {
    start_broker
    for port in 6691 6692; do
        QUEEN_DATABASE_URL="host=$DIR port=5499 user=postgres dbname=postgres" HOST=127.0.0.1 PORT=$port \
            LOG_LEVEL=warn FILE_BUFFER_DIR="$DIR/spool-$port" "${QUEEN_BIN:-./target/release/queen}" serve &
        PEERS+=($!)
        for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
    done
    sleep 1.5 # every broker has joined the channel
}
stop_three() {
    stop_broker
    for p in "${PEERS[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
    PEERS=()
}
trap 'stop_three 2>/dev/null; bench_cleanup' EXIT
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    for hints in true false; do
        export QUEEN_PEER_HINTS=$hints
        start_three
        if [ "$hints" = true ]; then
            ./target/release/queen-bench --url "$BROKER_URL" wake --pop-url http://127.0.0.1:6691 | grep '"scenario":"wake"'
        fi
        rate=$(./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" \
            | grep '^{' | python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read())["msg_per_s"]))')
        echo "push with hints $hints: $rate msg/s"
        stop_three
    done
done
