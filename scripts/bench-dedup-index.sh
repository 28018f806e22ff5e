#!/usr/bin/env bash
# The dedup index alone, four ways (issue 34; docs/PERFORMANCE.md, "Where a
# deduplicated push's PostgreSQL time goes"): pgbench writes 100 random
# 64-bit hashes per transaction, 8 clients each on its own partition (as the
# partition row lock serialises a partition's pushes), into stores preloaded
# with 2,000,000 entries: the current B-tree upsert, a hash index looked up
# then inserted, a ring of six time buckets, and one GIN-indexed array per
# segment. Interleaved for ROUNDS rounds; durable private cluster, localhost
# only, DURATION seconds per step.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-6}
ROUNDS=${ROUNDS:-3}
bash scripts/ensure-postgres.sh
source scripts/lib/pg-cluster.sh
start_pg_cluster 5488 "${PG_EXTRA:-}"
trap stop_pg_cluster EXIT
cp scripts/sql/dedup/*.sql "$PG_DIR/" && chmod a+r "$PG_DIR"/*.sql
"$PG_BIN/psql" -q -h "$PG_DIR" -p 5488 -U postgres -d postgres -f "$PG_DIR/setup.sql"
for round in $(seq 1 "$ROUNDS"); do
    for store in current hash buckets gin; do
        tps=$("$PG_BIN/pgbench" -h "$PG_DIR" -p 5488 -U postgres -n -c 8 -j 2 -T "$DURATION" -f "$PG_DIR/$store.sql" postgres 2>&1 \
            | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
        echo "round $round $store: $(awk -v t="$tps" 'BEGIN { printf "%.0f", t * 100 }') entries/s"
    done
done
