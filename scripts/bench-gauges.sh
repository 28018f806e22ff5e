#!/usr/bin/env bash
# The log's Prometheus gauges at scale (docs/PERFORMANCE.md): PARTITIONS
# partitions of one queue, each with a segment and two consumer groups'
# cursors behind the head, written by SQL; then a release broker on them, the
# gauge sampler's two queries timed in psql (twice each), and 20 scrapes of
# /metrics/prometheus timed by curl. Private cluster, localhost only.
set -euo pipefail
PARTITIONS=${PARTITIONS:-100000}
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
cargo build --locked --release --bins -q
source scripts/lib/pg-cluster.sh
start_pg_cluster 5512
BPID=
cleanup() { if [ -n "$BPID" ]; then kill "$BPID" 2>/dev/null || true; wait "$BPID" 2>/dev/null || true; fi; stop_pg_cluster; }
trap cleanup EXIT
PSQL=("$PG_BIN/psql" -q -h "$PG_DIR" -p 5512 -U postgres -d postgres)
URL="host=$PG_DIR port=5512 user=postgres dbname=postgres"
QUEEN_DATABASE_URL="$URL" ./target/release/queen migrate >/dev/null 2>&1
"${PSQL[@]}" <<SQL
INSERT INTO queen.queues (name) VALUES ('big');
INSERT INTO queen.partitions (queue_id, name, last_offset, last_write_at)
  SELECT 1, 'p' || g, 9, now() FROM generate_series(1, $PARTITIONS) g;
INSERT INTO queen.segments (partition_id, base_offset, end_offset, msg_count, created_at, blob)
  SELECT id, 0, 9, 10, now() - interval '1 minute', '\x00'::bytea FROM queen.partitions;
INSERT INTO queen.consumers (partition_id, consumer_group, committed)
  SELECT id, g, 4 FROM queen.partitions, (VALUES ('g1'), ('g2')) v(g);
ANALYZE;
SQL
QUEEN_DATABASE_URL="$URL" HOST=127.0.0.1 PORT=6697 LOG_LEVEL=warn ./target/release/queen serve &
BPID=$!
for _ in $(seq 1 100); do curl -sf http://127.0.0.1:6697/health >/dev/null && break; sleep 0.1; done
sleep 12 # at least one sampler pass (STATS_INTERVAL_MS, 10 s)
echo "== the sampler's queries, as maintenance::gauges sends them (twice each)"
Q1="WITH slowest AS (SELECT partition_id, min(committed) AS committed FROM queen.consumers GROUP BY partition_id)
SELECT q.name, count(p.id), COALESCE(sum(p.last_offset + 1 - p.log_start), 0),
  COALESCE(sum(GREATEST(p.last_offset - GREATEST(COALESCE(s.committed, -1), p.log_start - 1), 0)), 0),
  (SELECT count(*) FROM queen.dead_letters d WHERE d.queue_id = q.id)
FROM queen.queues q LEFT JOIN queen.partitions p ON p.queue_id = q.id LEFT JOIN slowest s ON s.partition_id = p.id GROUP BY q.id"
Q2="SELECT queue_name, consumer_group, sum(offset_lag), max(EXTRACT(EPOCH FROM now() - oldest_unconsumed_at))
FROM queen.cursor_lag GROUP BY 1, 2"
"${PSQL[@]}" -c '\timing on' -c "$Q1" -c "$Q1" -c "$Q2" -c "$Q2" | grep -E '^Time'
echo "== the gauges one scrape shows"
curl -s http://127.0.0.1:6697/metrics/prometheus | grep -E '^queen_(queue|consumer)_'
for _ in $(seq 1 20); do curl -s -o /dev/null -w '%{time_total}\n' http://127.0.0.1:6697/metrics/prometheus; done | sort -n \
    | awk '{a[NR]=$1} END {printf "scrape seconds over %d scrapes: min %s, median %s, max %s\n", NR, a[1], a[int((NR+1)/2)], a[NR]}'
