#!/usr/bin/env bash
# Fuzzes the whole HTTP surface from the broker's own OpenAPI document with
# schemathesis (tests/fuzz), against the real broker binary on a private
# PostgreSQL cluster, bounded: EXAMPLES per operation (default 30, about a
# minute on two cores), a fixed SEED (default 1) so a failure replays.
# It fails when a response is a 5xx other than 503, when a 4xx body is not
# JSON naming an error (tests/fuzz/hooks.py), or when the broker's log shows
# a panic. The system switches are left out: turning maintenance on would
# make most of the rest answer 503 or 204 and test nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
cargo build --locked --bin queen -q
VENV=target/fuzz-venv
source scripts/lib/venv.sh
ensure_venv "$VENV" tests/fuzz/requirements.txt
source scripts/lib/pg-cluster.sh
start_pg_cluster 5433 "-c fsync=off -c synchronous_commit=off"
WORK=$(mktemp -d /tmp/queen-api-fuzz-XXXXXX)
BROKER_PID=
cleanup() {
    [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null || true
    stop_pg_cluster
    rm -rf "$WORK"
}
trap cleanup EXIT
"${PG_AS[@]}" "$PG_BIN/createdb" -h "$PG_DIR" -p "$PG_PORT" -U postgres fuzz
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG="$WORK/broker.log"
QUEEN_DATABASE_URL="postgresql://postgres@${PG_DIR//\//%2F}:$PG_PORT/fuzz" HOST=127.0.0.1 PORT=$PORT \
    FILE_BUFFER_DIR="$WORK/spool" target/debug/queen serve >"$LOG" 2>&1 &
BROKER_PID=$!
python3 - "$PORT" <<'PY'
import sys, time, urllib.request
for _ in range(150):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=1)
        break
    except Exception:
        time.sleep(0.2)
else:
    sys.exit("the broker did not come up")
PY
status=0
SCHEMATHESIS_HOOKS=tests.fuzz.hooks timeout 900 "$VENV/bin/schemathesis" run "http://127.0.0.1:$PORT/api/v1/openapi.json" \
    --checks no_server_error_but_503,every_refusal_is_json_with_an_error \
    --max-examples "${EXAMPLES:-30}" --seed "${SEED:-1}" --request-timeout 10 --continue-on-failure \
    --exclude-path-regex '^/api/v1/system/' >"$WORK/report.txt" 2>&1 || status=$?
grep -E "generated|passed|failures" "$WORK/report.txt" | tail -3
if [ "$status" != 0 ]; then
    sed -n '/FAILURES/,/WARNINGS/p' "$WORK/report.txt" | head -150 >&2
    echo "api fuzzing: failures (schemathesis exit $status)" >&2
    exit 1
fi
if grep -q panicked "$LOG"; then
    grep -B2 -A10 panicked "$LOG" | head -60 >&2
    echo "api fuzzing: the broker panicked" >&2
    exit 1
fi
echo "api fuzzing: 0 failures, 0 panics"
