# Sourced by the bench scripts: a private, durable PostgreSQL cluster
# (default settings: fsync and synchronous commit on) on a unix socket, and a
# release broker on it. PG_EXTRA adds server options (e.g. the embedded
# cluster's tuning, to measure it); QUEEN_BIN runs another broker build (an
# A/B against a copy of an earlier one); SKIP_BUILD=1 uses the release
# binaries as they are (an interleaved A/B while the tree changes). Everything
# stays on localhost; cleanup runs on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash scripts/ensure-postgres.sh
[ -n "${SKIP_BUILD:-}" ] || cargo build --locked --release --bins -q
source scripts/lib/pg-cluster.sh
start_pg_cluster 5499 "${PG_EXTRA:-}"
BIN=$PG_BIN
DIR=$PG_DIR
BROKER_PID=
BROKER_URL=http://127.0.0.1:6690
bench_cleanup() {
    if [ -n "$BROKER_PID" ]; then kill "$BROKER_PID" 2>/dev/null || true; wait "$BROKER_PID" 2>/dev/null || true; fi
    stop_pg_cluster
}
trap bench_cleanup EXIT
PSQL=("$BIN/psql" -q -h "$DIR" -p 5499 -U postgres -d postgres)

start_broker() {
    QUEEN_DATABASE_URL="host=$DIR port=5499 user=postgres dbname=postgres" HOST=127.0.0.1 PORT=6690 \
        LOG_LEVEL=warn "${QUEEN_BIN:-./target/release/queen}" serve &
    BROKER_PID=$!
    for _ in $(seq 1 100); do curl -sf "$BROKER_URL/health" >/dev/null && return 0; sleep 0.1; done
    echo "broker did not start" >&2
    return 1
}

stop_broker() {
    kill "$BROKER_PID"; wait "$BROKER_PID" 2>/dev/null || true; BROKER_PID=
}
