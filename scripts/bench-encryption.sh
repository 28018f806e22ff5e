#!/usr/bin/env bash
# Encryption at rest (docs/PERFORMANCE.md): push and leased drain of an
# encrypted queue beside a plain one, on one broker with a key, interleaved
# (plain, encrypted, plain, ...) ROUNDS times; prints each run and the medians
# with their ratio, and the bytes a message takes in the segments of each.
# RANDOM_PAYLOAD=1 sends high-entropy payloads (random base64 text) instead
# of one repeated character, which compresses to almost nothing while an
# envelope does not compress at all. Durable private cluster, release broker,
# localhost only.
DURATION=${DURATION:-10}
KIND=
[ "${RANDOM_PAYLOAD:-0}" = 1 ] && KIND=--random-payload
MESSAGES=${MESSAGES:-200000}
ROUNDS=${ROUNDS:-3}
source "$(dirname "$0")/lib/bench-cluster.sh"
# A throwaway key for this run only.
export QUEEN_ENCRYPTION_KEY=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
start_broker
OUT=$DIR/encryption-runs.jsonl
for round in $(seq 1 "$ROUNDS"); do
    for enc in "" "--encrypted"; do
        echo "== round $round: push, batch 100, 10 partitions, 8 clients ${enc:-(plain)}"
        ./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions 10 --concurrency 8 \
            --duration "$DURATION" $enc $KIND | tee -a "$OUT"
        echo "== round $round: leased drain of $MESSAGES, pop batch 500, 4 consumers ${enc:-(plain)}"
        ./target/release/queen-bench --url "$BROKER_URL" consume --messages "$MESSAGES" --partitions 10 --batch 500 \
            --concurrency 4 $enc $KIND | tee -a "$OUT"
    done
done
echo "== stored bytes per message (segment blobs), plain and encrypted queues"
"${PSQL[@]}" -c "SELECT q.encryption_enabled AS encrypted,
        round(sum(octet_length(s.blob))::numeric / sum(s.msg_count), 1) AS blob_bytes_per_message,
        round(sum(s.msg_count)::numeric / count(*), 1) AS messages_per_segment
    FROM queen.segments s JOIN queen.partitions p ON p.id = s.partition_id JOIN queen.queues q ON q.id = p.queue_id
    GROUP BY 1 ORDER BY 1"
python3 - "$OUT" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
print("scenario  plain msg/s (runs)                 encrypted msg/s (runs)             median ratio")
for scenario in ("push", "consume"):
    by = {e: [r["msg_per_s"] for r in runs if r["scenario"] == scenario and r.get("encrypted") == e] for e in (False, True)}
    plain, enc = statistics.median(by[False]), statistics.median(by[True])
    fmt = lambda v: " / ".join(f"{x:,.0f}" for x in v)
    print(f"{scenario:<9} {plain:>9,.0f} ({fmt(by[False])})  {enc:>9,.0f} ({fmt(by[True])})  {enc / plain:.2f}")
PY
