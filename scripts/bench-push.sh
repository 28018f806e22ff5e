#!/usr/bin/env bash
# Push throughput of the broker beside the raw commit rates of the same
# PostgreSQL, measured in one run on one machine (docs/PERFORMANCE.md).
#
# Starts a private, durable cluster (default settings: fsync and synchronous
# commit on), a release broker on it, runs queen-bench, then pgbench with the
# same payload size and client count. Everything on localhost; bounded by
# DURATION seconds per step.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-20}
CLIENTS=${CLIENTS:-8}
PARTITIONS=${PARTITIONS:-10}
PAYLOAD=${PAYLOAD:-100}
bash scripts/ensure-postgres.sh
cargo build --locked --release --bins -q
BIN=$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")
DIR=$(mktemp -d /tmp/queen-bench-XXXXXX)
AS=()
if [ "$(id -u)" = 0 ]; then chown postgres: "$DIR"; AS=(runuser -u postgres --); fi
"${AS[@]}" "$BIN/initdb" -D "$DIR/pgdata" -U postgres -A trust -E UTF8 --locale=C >/dev/null
"${AS[@]}" "$BIN/pg_ctl" start -D "$DIR/pgdata" -w -s -l "$DIR/pg.log" \
    -o "-c listen_addresses='' -k $DIR -p 5499 -c max_connections=300 -c TimeZone=UTC"
BROKER_PID=
cleanup() {
    [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null && wait "$BROKER_PID" 2>/dev/null || true
    "${AS[@]}" "$BIN/pg_ctl" stop -D "$DIR/pgdata" -m fast -s || true
    rm -rf "$DIR"
}
trap cleanup EXIT
PSQL=("$BIN/psql" -q -h "$DIR" -p 5499 -U postgres -d postgres)

QUEEN_DATABASE_URL="host=$DIR port=5499 user=postgres dbname=postgres" HOST=127.0.0.1 PORT=6690 \
    LOG_LEVEL=warn ./target/release/queen serve &
BROKER_PID=$!
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:6690/health >/dev/null && break; sleep 0.1; done

echo "== broker: push, batch 1 and batch 100, $PARTITIONS partitions, $CLIENTS clients, ${PAYLOAD}-byte payloads"
./target/release/queen-bench --url http://127.0.0.1:6690 push --batch 1 --partitions "$PARTITIONS" \
    --concurrency "$CLIENTS" --duration "$DURATION" --payload-size "$PAYLOAD"
./target/release/queen-bench --url http://127.0.0.1:6690 push --batch 100 --partitions "$PARTITIONS" \
    --concurrency "$CLIENTS" --duration "$DURATION" --payload-size "$PAYLOAD"
kill "$BROKER_PID"; wait "$BROKER_PID" 2>/dev/null || true; BROKER_PID=

echo "== baseline: pgbench on the same PostgreSQL, $CLIENTS clients"
"${PSQL[@]}" -c "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload text NOT NULL)"
echo "INSERT INTO bench_rows (payload) VALUES (repeat('x', $PAYLOAD));" > "$DIR/single.sql"
echo "INSERT INTO bench_rows (payload) SELECT repeat('x', $PAYLOAD) FROM generate_series(1, 100);" > "$DIR/batch.sql"
chmod a+r "$DIR"/*.sql
for f in single batch; do
    out=$("$BIN/pgbench" -h "$DIR" -p 5499 -U postgres -n -c "$CLIENTS" -j 2 -T "$DURATION" -f "$DIR/$f.sql" postgres 2>&1)
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    if [ "$f" = single ]; then
        echo "baseline single-row INSERT commits/s: $tps"
        echo "{\"scenario\":\"baseline-single-row\",\"clients\":$CLIENTS,\"commits_per_s\":$tps}"
    else
        rows=$(awk -v t="$tps" 'BEGIN { printf "%.0f", t * 100 }')
        echo "baseline 100-row INSERT batches: $tps commits/s = $rows rows/s"
        echo "{\"scenario\":\"baseline-100-row\",\"clients\":$CLIENTS,\"commits_per_s\":$tps,\"rows_per_s\":$rows}"
    fi
done
