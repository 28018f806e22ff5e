#!/usr/bin/env bash
# How far one PostgreSQL primary goes (docs/SCALING.md): push, consume, and
# the two together, each with the CPU seconds every process spent per
# message (scripts/lib/cpu-sample.py) and the WAL bytes PostgreSQL wrote per
# message. Messages per second per PostgreSQL core is 1,000,000 divided by
# PostgreSQL's µs per message; the WAL rate says when the disk, not a core,
# is the bound. ROUNDS rounds on one broker; durable private cluster,
# release broker, localhost only, bounded runs.
DURATION=${DURATION:-10}
MESSAGES=${MESSAGES:-500000}
ROUNDS=${ROUNDS:-3}
# Prepared transactions for the two-phase commit baseline below.
PG_EXTRA=${PG_EXTRA:-"-c max_prepared_transactions=64"}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
source scripts/lib/sampled.sh
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round: push, batch 100, 10 partitions, 8 clients, client-minted ids, default queue (dedup window 1 h)"
    sampled push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION"
    echo "== round $round: the same, dedupWindowSeconds 0"
    sampled push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" --dedup-window 0
    echo "== round $round: consume $MESSAGES, leased pops of 500 + ack/batch, 4 consumers (after the prefill)"
    AFTER=prefilled sampled consume --messages "$MESSAGES" --partitions 10 --batch 500 --concurrency 4
    echo "== round $round: together: $MESSAGES pushed at batch 100 by 2 producers while one group of 4 consumers reads them"
    sampled fanout --messages "$MESSAGES" --batch 100 --partitions 10 --producers 2 --groups 1 --consumers 4
done
stop_broker

# What a transaction spanning two shards adds (docs/SCALING.md): Citus
# commits it with two-phase commit, PREPARE TRANSACTION then COMMIT
# PREPARED on every participant. On one server: the same 100-row insert
# committed plainly and through two-phase commit, 8 clients, same run.
echo "== two-phase commit on this PostgreSQL: a 100-row INSERT committed, then prepared and committed prepared"
"${PSQL[@]}" -c "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload text NOT NULL)"
echo "INSERT INTO bench_rows (payload) SELECT repeat('x', 100) FROM generate_series(1, 100);" > "$DIR/plain.sql"
cat > "$DIR/twophase.sql" <<'SQL'
\set gid random(1, 1000000000000)
BEGIN;
INSERT INTO bench_rows (payload) SELECT repeat('x', 100) FROM generate_series(1, 100);
PREPARE TRANSACTION 'bench_:client_id_:gid';
COMMIT PREPARED 'bench_:client_id_:gid';
SQL
chmod a+r "$DIR"/*.sql
tps() { "$BIN/pgbench" -h "$DIR" -p 5499 -U postgres -n -c 8 -j 2 -T "$DURATION" -f "$DIR/$1.sql" postgres 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p'; }
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round: plain commits/s $(tps plain), two-phase commits/s $(tps twophase)"
done
