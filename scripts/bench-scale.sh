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
DURATION=${DURATION:-15}
PARTITIONS_MANY=${PARTITIONS_MANY:-1000000}
source "$(dirname "$0")/lib/bench-cluster.sh"
start_broker
BENCH=./target/release/queen-bench
rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$BROKER_PID/status"; }
partitions() { "${PSQL[@]}" -Atc "SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = '$1'"; }

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
