#!/usr/bin/env bash
# Push with deduplication, the path users take (issue 34, docs/PERFORMANCE.md):
# batch 100, 8 clients, PARTITIONS partitions, client-minted random v4
# transactionIds on a queue with the default window (WINDOW seconds, 3600),
# beside the same on a window-0 queue, and both with broker-minted ids,
# interleaved for ROUNDS rounds on one broker, each with CPU per message by
# process and WAL bytes per message; then the 100-row INSERT baseline of the
# same PostgreSQL. Durable private cluster, release broker, localhost only,
# bounded runs.
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
PARTITIONS=${PARTITIONS:-10}
WINDOW=${WINDOW:-3600}
# PRELOAD transactionIds spread over the window, stored before the rounds as
# segments of 100 hashes in the partitions of the queue the windowed
# client-id runs push to: what a long window holds in its steady state, which
# a 10 s run never grows on its own. (Their blobs are placeholders: nothing
# pops them.) A fresh broker then pushes for 1 s and so learns them, as a
# broker does once per partition.
PRELOAD=${PRELOAD:-0}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
source scripts/lib/sampled.sh
push() { sampled push --batch 100 --partitions "$PARTITIONS" --concurrency 8 --duration "$DURATION" "$@"; }
QUEUE=bench.dedup.windowed
./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions "$PARTITIONS" --concurrency 8 --duration 1 \
    --dedup-window "$WINDOW" --queue "$QUEUE" > /dev/null
if [ "$PRELOAD" -gt 0 ]; then
    echo "== preloading $PRELOAD transactionIds over the last $WINDOW s"
    # The warm-up's segments go first: created_at must rise with the offset.
    "${PSQL[@]}" -c "
        DELETE FROM queen.segments s USING queen.partitions p, queen.queues q
        WHERE s.partition_id = p.id AND q.id = p.queue_id AND q.name = '$QUEUE'" -c "
        UPDATE queen.partitions p SET last_offset = -1 FROM queen.queues q WHERE q.id = p.queue_id AND q.name = '$QUEUE'" -c "
        WITH p AS (
            SELECT p.id, p.last_offset, ($PRELOAD / $PARTITIONS / 100) AS segs
            FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id AND q.name = '$QUEUE'
        ), ins AS (
            INSERT INTO queen.segments (partition_id, base_offset, end_offset, msg_count, created_at, blob, txn_hashes)
            SELECT p.id, p.last_offset + 1 + k * 100, p.last_offset + k * 100 + 100, 100,
                   now() - make_interval(secs => $WINDOW) + make_interval(secs => ($WINDOW - 60) * (k + 1)::float8 / p.segs),
                   '\\x00',
                   ARRAY(SELECT (random() * 9.2e18)::bigint * (CASE WHEN random() < 0.5 THEN -1 ELSE 1 END)
                         FROM generate_series(1, 100) WHERE k >= 0)
            FROM p CROSS JOIN generate_series(0, p.segs - 1) k
            RETURNING 1)
        UPDATE queen.partitions x SET last_offset = x.last_offset + p.segs * 100,
                                      last_write_at = now()
        FROM p WHERE x.id = p.id" -c "CHECKPOINT"
    stop_broker # it remembers the warm-up's segments, which are gone
    start_broker
    ./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions "$PARTITIONS" --concurrency 8 --duration 1 \
        --dedup-window "$WINDOW" --queue "$QUEUE" > /dev/null
fi
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round: client-minted ids, window $WINDOW s"
    push --dedup-window "$WINDOW" --queue "$QUEUE"
    echo "== round $round: client-minted ids, window 0"
    push --dedup-window 0
    echo "== round $round: broker-minted ids, window $WINDOW s"
    push --dedup-window "$WINDOW" --ids broker
    echo "== round $round: broker-minted ids, window 0"
    push --dedup-window 0 --ids broker
done
"${PSQL[@]}" -c "SELECT relname, pg_size_pretty(pg_relation_size(oid)) AS heap,
                         pg_size_pretty(pg_relation_size(reltoastrelid)) AS toast,
                         pg_size_pretty(pg_indexes_size(oid)) AS indexes
                  FROM pg_class WHERE relnamespace = 'queen'::regnamespace AND relname IN ('segments', 'txn_index')"
stop_broker
echo "== baseline: 100-row INSERT commits, 8 clients, on the same PostgreSQL"
"${PSQL[@]}" -c "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload text NOT NULL)"
echo "INSERT INTO bench_rows (payload) SELECT repeat('x', 100) FROM generate_series(1, 100);" > "$DIR/batch.sql"
chmod a+r "$DIR/batch.sql"
for round in $(seq 1 "$ROUNDS"); do
    tps=$("$BIN/pgbench" -h "$DIR" -p 5499 -U postgres -n -c 8 -j 2 -T "$DURATION" -f "$DIR/batch.sql" postgres 2>&1 \
        | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    echo "baseline round $round: $(awk -v t="$tps" 'BEGIN { printf "%.0f", t * 100 }') rows/s"
done
