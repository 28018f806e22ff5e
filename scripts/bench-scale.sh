#!/usr/bin/env bash
# Scale (issue 51; docs/PERFORMANCE.md): push at batch 100 against one queue
# of PARTITIONS_MANY partitions (1,000,000 by default) beside 10 partitions,
# in one run on one broker:
#
#   1. push to 10 partitions for DURATION s (the baseline);
#   2. push creating the partitions: every request to the next new partition,
#      until PARTITIONS_MANY exist (its rate is "created by the pushes");
#   3. the broker's RSS once idle, minus its RSS before step 2, per partition;
#   4. push over the PARTITIONS_MANY existing partitions for DURATION s;
#   5. push to 10 partitions again (the baseline's drift over the run).
#
# 8 clients throughout. Private durable cluster, release broker, localhost.
#
# CASES (default "partitions queues groups drain passes") picks the parts; each runs on a
# fresh broker of the same cluster:
#
#   queues: ROUNDS (3) rounds of push at batch 100 over one queue of 100,000
#     partitions and over 10,000 queues of 10, alternating (the pushes create
#     them as they go); then a leased drain (pop batch 100, ack/batch, 4
#     consumers) of 1,000,000 messages spread as 10 per partition over each
#     shape.
#   groups: push at batch 100 to 10 partitions with one consumer group's
#     ring and with GROUPS_MANY (1,000) groups' rings (each group popped
#     once and stopped), ROUNDS rounds alternating; then GROUPS_MANY groups each draining while producers push
#     at a paced FANOUT_RATE (100 msg/s) beside one group doing the same,
#     and unpaced (as fast as the producers can) for the shared-CPU figure.
#   drain: ROUNDS rounds of a leased drain (pop batch 100 over up to 50
#     partitions, ack/batch, DRAIN_CONSUMERS (4) consumers, each popping and
#     acking in turn) of DRAIN_PER_PARTITION (5) messages
#     in each of PARTITIONS_MANY partitions, beside the same number of
#     messages in 10 partitions, alternating; each drain prefills a queue of
#     its own (1,000 messages to a request). Each prints where its acks and
#     claims waited (scripts/lib/stages.py; the prefill's pushes are not in it).
#   passes: a queue of PARTITIONS_MANY partitions holding one message each
#     (queen-bench fill), read to its end by group e2e (autoAck), beside 10
#     partitions read the same way (then a fresh broker: see the comment
#     below); long-poll e2e latency, one message a
#     push at E2E_RATE (1,000) msg/s, over the 10 and over the
#     PARTITIONS_MANY partitions; then push at batch 100 to 10 partitions of
#     another queue for DURATION s (its p99 without a pass), again right
#     after the wide queue's retention is set to 1 s, while retention
#     removes its segments (p99 during the pass; the pass is timed to its
#     end), and once more after it.
#   idle-groups: the broker's memory per idle consumer group: one queue of
#     10 partitions, then GROUPS_IDLE (10,000) groups each popping it once
#     (autoAck, batch 1: first contact registers the group and seeds its
#     cursors, the pop builds its ring), then idle; the broker's RSS before
#     and after, and PostgreSQL's cursor and subscription bytes, per group.
#   volume: push at batch 100 to 10 partitions, in runs of VOLUME_CHUNK (60) s, until
#     VOLUME_MESSAGES (100,000,000) messages are stored: the baseline for
#     "partitions" at the same volume. Creating 1,000,000 partitions at batch
#     100 writes at least 100,000,000 messages (about 151,000,000 measured:
#     the creating runs go by time), and the database's growth alone slows
#     any push (a 10-partition push of that volume falls from about 206,000
#     msg/s in its first minute to 153,000-180,000 in its last); run it
#     alone (CASES=volume, a fresh cluster) with VOLUME_MESSAGES set to what
#     the creating runs pushed (their lines' "messages" summed).
DURATION=${DURATION:-15}
PARTITIONS_MANY=${PARTITIONS_MANY:-1000000}
CASES=${CASES:-partitions queues groups drain passes}
ROUNDS=${ROUNDS:-3}
GROUPS_MANY=${GROUPS_MANY:-1000}
FANOUT_RATE=${FANOUT_RATE:-100}
DRAIN_PER_PARTITION=${DRAIN_PER_PARTITION:-5}
DRAIN_CONSUMERS=${DRAIN_CONSUMERS:-4}
E2E_RATE=${E2E_RATE:-1000}
source "$(dirname "$0")/lib/bench-cluster.sh"
BENCH=./target/release/queen-bench
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$BROKER_PID/status"; }
partitions() { "${PSQL[@]}" -Atc "SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '$1'"; }
wants() { [[ " $CASES " == *" $1 "* ]]; }

if wants queues; then
    start_broker
    for round in $(seq 1 "$ROUNDS"); do
        echo "== round $round: push, one queue of 100,000 partitions"
        "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 100000 --concurrency 8 --duration "$DURATION" --queue scale-one | tail -2 | head -1
        echo "== round $round: push, 10,000 queues of 10 partitions"
        "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --queues 10000 --concurrency 8 --duration "$DURATION" --queue scale-many | tail -2 | head -1
    done
    echo "== drain: 1,000,000 messages, 10 in each of 100,000 partitions of one queue"
    "$BENCH" --url "$BROKER_URL" consume --messages 1000000 --partitions 100000 --batch 100 --pop-partitions 50 --concurrency 4 | tail -2 | head -1
    echo "== drain: 1,000,000 messages, 10 in each partition of 10,000 queues of 10"
    "$BENCH" --url "$BROKER_URL" consume --messages 1000000 --partitions 10 --queues 10000 --batch 100 --pop-partitions 50 --concurrency 4 | tail -2 | head -1
    stop_broker
fi

if wants groups; then
    start_broker
    rings() { # $1 queue, $2 groups: one autoAck pop of each group builds its ring
        seq 1 "$2" | xargs -P 8 -I{} curl -s -o /dev/null "$BROKER_URL/api/v1/pop/queue/$1?consumerGroup=g{}&batch=1&autoAck=true"
    }
    for round in $(seq 1 "$ROUNDS"); do
        for g in 1 "$GROUPS_MANY"; do
            q=scale-rings-$g-$round
            "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration 1 --queue "$q" >/dev/null
            sleep 5
            before=$(rss_kb)
            rings "$q" "$g"
            sleep 10
            after=$(rss_kb)
            # (The RSS shown moves with the pushes' dedup memory more than with
            # the rings: it is not a per-group figure.)
            echo "== round $round: push, 10 partitions, $g groups' rings (broker RSS $((before / 1024)) -> $((after / 1024)) MB)"
            "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" --queue "$q" | tail -2 | head -1
        done
    done
    for g in 1 "$GROUPS_MANY"; do
        echo "== $g groups draining, push paced at $FANOUT_RATE msg/s (batch 10) for 30 s"
        "$BENCH" --url "$BROKER_URL" fanout --messages $((FANOUT_RATE * 30)) --batch 10 --partitions 10 --producers 2 \
            --groups "$g" --consumers 1 --rate "$FANOUT_RATE" --duration 300 | head -3
    done
    for g in 1 "$GROUPS_MANY"; do
        echo "== $g groups draining, push as fast as 2 producers can (20,000 messages at batch 100)"
        "$BENCH" --url "$BROKER_URL" fanout --messages 20000 --batch 100 --partitions 10 --producers 2 \
            --groups "$g" --consumers 1 --duration 300 | head -3
    done
    stop_broker
fi

if wants drain; then
    start_broker
    messages=$((PARTITIONS_MANY * DRAIN_PER_PARTITION))
    for round in $(seq 1 "$ROUNDS"); do
        for parts in 10 "$PARTITIONS_MANY"; do
            echo "== round $round: leased drain of $messages messages over $parts partitions"
            curl -s "$BROKER_URL/metrics/prometheus" > "$DIR/stages-before"
            "$BENCH" --url "$BROKER_URL" consume --messages "$messages" --partitions "$parts" --batch 100 \
                --pop-partitions 50 --concurrency "$DRAIN_CONSUMERS" --duration 1800 | tail -3 | head -2
            curl -s "$BROKER_URL/metrics/prometheus" > "$DIR/stages-after"
            python3 scripts/lib/stages.py "$DIR/stages-before" "$DIR/stages-after"
        done
    done
    stop_broker
fi

if wants passes; then
    start_broker
    "$BENCH" --url "$BROKER_URL" fill --queue scale-pass --messages "$PARTITIONS_MANY" --partitions "$PARTITIONS_MANY"
    # Long-polls over the wide queue: group e2e reads what fill wrote first,
    # so its cursors stand at the end of every partition, as those of
    # consumers keeping up do; the 10-partition queue gets the same.
    "$BENCH" --url "$BROKER_URL" fill --queue scale-e2e-10 --messages 10 --partitions 10 >/dev/null
    for q in scale-e2e-10:10 "scale-pass:$PARTITIONS_MANY"; do
        "$BENCH" --url "$BROKER_URL" consume --queue "${q%%:*}" --group e2e --auto-ack --messages "${q#*:}" --partitions "${q#*:}" \
            --batch 100 --pop-partitions 100 --concurrency 4 --duration 600 | tail -2 | head -1
    done
    # A ring keeps the partitions a drain emptied until pops look at them
    # again (docs/PERFORMANCE.md): a fresh broker's rings start from SQL,
    # which knows they are empty; each group's ring is made before the clock.
    stop_broker
    start_broker
    for q in scale-e2e-10 scale-pass; do
        curl -s -o /dev/null "$BROKER_URL/api/v1/pop/queue/$q?consumerGroup=e2e&batch=1&autoAck=true"
    done
    for q in scale-e2e-10:10 "scale-pass:$PARTITIONS_MANY"; do
        echo "== long-poll e2e, one message a push at $E2E_RATE msg/s over ${q#*:} partitions"
        "$BENCH" --url "$BROKER_URL" e2e --queue "${q%%:*}" --partitions "${q#*:}" --rate "$E2E_RATE" --batch 1 --consumers 8 \
            --duration "$DURATION" | sed -n 1,2p
    done
    removed() { curl -s "$BROKER_URL/metrics/prometheus" | awk '/^queen_retention_removed_segments_total/ {n = int($2)} END {print n + 0}'; }
    push_p99() {
        echo "== push at batch 100, 10 partitions: $1"
        "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" --queue scale-pass-push | tail -2 | head -1
    }
    sleep 10
    push_p99 "no pass running"
    segments=$("${PSQL[@]}" -Atc "SELECT count(*) FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'scale-pass'")
    before=$(removed)
    started=$(date +%s)
    curl -sf -X POST "$BROKER_URL/api/v1/configure" -H 'content-type: application/json' \
        -d '{"queue": "scale-pass", "options": {"retentionSeconds": 1}}' >/dev/null
    push_p99 "while retention removes $segments segments of $PARTITIONS_MANY partitions"
    echo "removed during that push: $(( $(removed) - before ))"
    until [ $(( $(removed) - before )) -ge "$segments" ] || [ $(( $(date +%s) - started )) -gt 1800 ]; do sleep 1; done
    echo "retention pass: $(( $(removed) - before )) segments removed in $(( $(date +%s) - started )) s"
    push_p99 "after the pass"
    stop_broker
fi

if wants idle-groups; then
    start_broker
    q=scale-idle-groups
    "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration 2 --queue "$q" >/dev/null
    curl -s -o /dev/null "$BROKER_URL/api/v1/pop/queue/$q?consumerGroup=first&batch=1&autoAck=true"
    sleep 15
    before=$(rss_kb)
    bytes() { "${PSQL[@]}" -Atc "SELECT pg_total_relation_size('queen.consumers') + pg_total_relation_size('queen.subscriptions')"; }
    db_before=$(bytes)
    n=${GROUPS_IDLE:-10000}
    started=$(date +%s)
    seq 1 "$n" | xargs -P 8 -I{} curl -s -o /dev/null -w '%{http_code}\n' \
        "$BROKER_URL/api/v1/pop/queue/$q?consumerGroup=idle{}&batch=1&autoAck=true" | sort | uniq -c
    echo "$n groups popped once in $(( $(date +%s) - started )) s"
    sleep 15 # idle: background passes settle
    after=$(rss_kb)
    db_after=$(bytes)
    echo "== broker RSS: $((before / 1024)) MB before, $((after / 1024)) MB with $n idle groups:" \
        "$(( (after - before) * 1024 / n )) bytes per group"
    echo "== cursors and subscriptions: $(( (db_after - db_before) / n )) bytes per group in PostgreSQL (10 partitions)"
    stop_broker
fi

if wants volume; then
    start_broker
    target=${VOLUME_MESSAGES:-100000000}
    pushed=0
    spent=0
    echo "== push, 10 partitions, until $target messages"
    while [ "$pushed" -lt "$target" ]; do
        line=$("$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "${VOLUME_CHUNK:-60}" --queue scale-volume \
            | grep '^{' | tail -1)
        pushed=$((pushed + $(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["messages"])')))
        spent=$(echo "$spent $line" | python3 -c 'import json,sys; a,b=sys.stdin.read().split(" ",1); print(float(a)+json.loads(b)["seconds"])')
        echo "$pushed messages in $spent s"
    done
    echo "volume: $pushed messages to 10 partitions in $spent s: $(python3 -c "print(round($pushed / $spent))") msg/s"
    stop_broker
fi

wants partitions || exit 0
start_broker

echo "== push, 10 partitions (baseline)"
"$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" --queue scale-10

# Creating: queen-bench sends request n to partition n mod PARTITIONS_MANY,
# so a run long enough for PARTITIONS_MANY requests creates them all. Its
# length comes from a short probe of the request rate, then runs are repeated
# until every partition exists.
sleep 2
rss_before=$(rss_kb)
echo "== push creating $PARTITIONS_MANY partitions (broker RSS before: $((rss_before / 1024)) MB)"
started=$(date +%s)
while [ "$(partitions scale-many)" -lt "$PARTITIONS_MANY" ]; do
    left=$((PARTITIONS_MANY - $(partitions scale-many)))
    # About 1,000 requests a second at batch 100; a run covers what is left.
    secs=$(( left / 1000 + 5 ))
    "$BENCH" --url "$BROKER_URL" push --batch 100 --partitions "$PARTITIONS_MANY" --concurrency 8 \
        --duration "$secs" --queue scale-many | tail -2
    [ $(( $(date +%s) - started )) -lt "${CREATE_LIMIT:-3600}" ] || { echo "creating took over CREATE_LIMIT s; stopping" >&2; break; }
done
made=$(partitions scale-many)
echo "created $made partitions in $(( $(date +%s) - started )) s"

sleep 15 # the broker idle: background passes settle
rss_after=$(rss_kb)
echo "== broker RSS idle: $((rss_after / 1024)) MB, $(( (rss_after - rss_before) * 1024 / made )) bytes per partition over the 10-partition state"

echo "== push over $made existing partitions"
"$BENCH" --url "$BROKER_URL" push --batch 100 --partitions "$PARTITIONS_MANY" --concurrency 8 --duration "$DURATION" --queue scale-many

echo "== push, 10 partitions (baseline again)"
"$BENCH" --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 --duration "$DURATION" --queue scale-10
stop_broker
