#!/usr/bin/env bash
# Small requests (issue 46, docs/PERFORMANCE.md): what one message per
# request costs, beside PostgreSQL's own single-row commits on the same
# cluster in the same round. Each round runs pgbench's single-row INSERT at
# CLIENTS clients, then, for each writer count in WRITERS (of shared ack and
# KV commits; a count at least CLIENTS gives every request a write of its
# own: sharing off), a
# fresh broker measuring: push at batch 1 (CLIENTS clients), a consume loop
# of leased, long-polling pop batch 1 + one ack per message (CLIENTS
# consumers over PARTITIONS partitions, then over WIDE partitions so that
# every consumer holds a lease; MESSAGES pre-filled), and single KV puts (CLIENTS
# clients); each with PostgreSQL commits per message (pg_stat_database, the
# consume figure includes its pre-fill of 1,000-message pushes). ROUNDS
# interleaved rounds; read the medians. CASES picks some of the cases. Durable private cluster, release
# broker, localhost only, every step bounded by DURATION seconds.
DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-32}
PARTITIONS=${PARTITIONS:-10}
WIDE=${WIDE:-100}
MESSAGES=${MESSAGES:-20000}
ROUNDS=${ROUNDS:-3}
WRITERS=${WRITERS:-"64 2"}
CASES=${CASES:-"push-b1 pop-b1-ack pop-b1-ack-wide kv-put"}
source "$(dirname "$0")/lib/bench-cluster.sh"
BENCH=(./target/release/queen-bench --url "$BROKER_URL")
"${PSQL[@]}" -c "CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload text NOT NULL)"
echo "INSERT INTO bench_rows (payload) VALUES (repeat('x', 100));" > "$DIR/single.sql"
chmod a+r "$DIR"/*.sql

# PostgreSQL's commits so far in the database, read after the stats flush.
commits() {
    sleep 1.5
    "${PSQL[@]}" -tAc "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
}
# Runs a queen-bench case; prints its JSON line with the commits per message
# it cost added.
measured() { # label, queen-bench arguments...
    local label=$1 before after line n
    shift
    [[ " $CASES " == *" $label "* ]] || return 0
    before=$(commits)
    curl -s "$BROKER_URL/metrics/prometheus" > "$DIR/stages-before"
    line=$("${BENCH[@]}" "$@" | grep '^{')
    curl -s "$BROKER_URL/metrics/prometheus" > "$DIR/stages-after"
    after=$(commits)
    n=$(echo "$line" | sed -n 's/.*"\(messages\|calls\|ops\)":\([0-9]*\).*/\2/p' | head -1)
    echo "$line" | sed "s/^{/{\"case\":\"$label\",\"writers\":$writers,\"commits\":$((after - before)),\"commits_per_message\":$(awk -v c=$((after - before)) -v m="${n:-0}" 'BEGIN { if (m > 0) printf "%.3f", c / m; else print "null" }'),/"
    # Where its requests waited (scripts/lib/stages.py): the push's stages,
    # or the acks' and claims' (a consume's pre-fill pushes are left out).
    case $label in
        push-*) python3 scripts/lib/stages.py "$DIR/stages-before" "$DIR/stages-after" queen_push_stage_seconds ;;
        pop-*) python3 scripts/lib/stages.py "$DIR/stages-before" "$DIR/stages-after" ;;
    esac
}

for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    tps=$("$BIN/pgbench" -h "$DIR" -p 5499 -U postgres -n -c "$CLIENTS" -j 2 -T "$DURATION" -f "$DIR/single.sql" postgres 2>&1 \
        | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    echo "{\"case\":\"baseline-single-row\",\"clients\":$CLIENTS,\"commits_per_s\":$tps}"
    for writers in $WRITERS; do
        QUEEN_ACK_GROUP_WRITERS=$writers QUEEN_KV_GROUP_WRITERS=$writers start_broker
        measured push-b1 push --batch 1 --partitions "$PARTITIONS" --concurrency "$CLIENTS" --duration "$DURATION"
        measured pop-b1-ack consume --messages "$MESSAGES" --partitions "$PARTITIONS" --batch 1 --pop-partitions 1 \
            --concurrency "$CLIENTS" --duration "$DURATION" --wait
        measured pop-b1-ack-wide consume --messages "$MESSAGES" --partitions "$WIDE" --batch 1 --pop-partitions 1 \
            --concurrency "$CLIENTS" --duration "$DURATION" --wait
        measured kv-put kv --mode put --concurrency "$CLIENTS" --duration "$DURATION"
        stop_broker
    done
done
