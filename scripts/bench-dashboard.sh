#!/usr/bin/env bash
# What an open dashboard costs a loaded broker (docs/PERFORMANCE.md, issue
# 31): push at batch 100 by 8 clients for DURATION seconds, with and without
# a headless Chromium showing the overview (which reloads its data every
# 5 s), alternating, ROUNDS rounds; with the broker's and PostgreSQL's CPU
# per message (scripts/lib/cpu-sample.py). The browser's own CPU is on the
# same two cores, so the rate ratio is pessimistic; the broker's CPU per
# message is the page's cost to the broker. Localhost only.
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
OUT=$DIR/bench.out
PROFILE=$(mktemp -d)
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    for page in without with; do
        CHROME=
        if [ "$page" = with ]; then
            chromium --headless=new --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
                --disable-component-update --disable-sync --user-data-dir="$PROFILE" --remote-debugging-port=0 \
                "$BROKER_URL/#/overview" >/dev/null 2>&1 &
            CHROME=$!
            sleep 3
        fi
        ./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" > "$OUT" &
        pid=$!
        cpu=$(python3 scripts/lib/cpu-sample.py "$OUT" "$BROKER_PID")
        wait "$pid"
        rate=$(grep '^{' "$OUT" | python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read())["msg_per_s"]))')
        echo "dashboard $page: $rate msg/s"
        echo "$cpu" | tail -1
        if [ -n "$CHROME" ]; then kill "$CHROME" 2>/dev/null; wait "$CHROME" 2>/dev/null || true; fi
    done
done
rm -rf "$PROFILE"
