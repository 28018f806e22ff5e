#!/usr/bin/env bash
# Kafka's own client against the HTTP API on the same broker
# (docs/PERFORMANCE.md, issue 47), ROUNDS interleaved rounds:
#   - HTTP push at batch 100, 8 clients, 8 partitions, for DURATION seconds;
#   - librdkafka (confluent-kafka) producing MESSAGES 100-byte records with
#     its defaults (linger, batching, the default partitioner);
#   - the HTTP leased drain (pop 500 + ack/batch, 4 consumers) of MESSAGES;
#   - one Kafka group member draining the MESSAGES it produced, auto commit.
# Then the listener's idle cost: push at batch 100 with QUEEN_KAFKA_ENABLED
# off and on, alternating. CASES=idempotence: librdkafka producing MESSAGES
# with enable.idempotence off and on, alternating on one broker a round
# (issue 48: the durable sequence windows' cost). CASES="clients idle
# idempotence" picks the parts. Durable
# private cluster, release broker, localhost only.
ROUNDS=${ROUNDS:-3}
CASES=${CASES:-clients idle idempotence}
MESSAGES=${MESSAGES:-500000}
DURATION=${DURATION:-10}
source "$(dirname "$0")/lib/bench-cluster.sh"
VENV=target/kafka-venv
source scripts/lib/venv.sh
ensure_venv "$VENV" tests/kafka/requirements.txt
KAFKA=127.0.0.1:9392
start_kafka_broker() {
    QUEEN_KAFKA_LISTEN=$KAFKA start_broker
}
fresh_schema() {
    "${PSQL[@]}" -c "SET client_min_messages = warning" -c "DROP SCHEMA queen CASCADE"
}
[[ " $CASES " == *" clients "* ]] && for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    start_kafka_broker
    ./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions 8 --concurrency 8 --duration "$DURATION" | grep '^{'
    "$VENV/bin/python" scripts/lib/kafka-bench.py produce "$KAFKA" "k$round" "$MESSAGES" 100
    ./target/release/queen-bench --url "$BROKER_URL" consume --messages "$MESSAGES" --partitions 8 --batch 500 --concurrency 4 | grep '^{'
    "$VENV/bin/python" scripts/lib/kafka-bench.py consume "$KAFKA" "k$round" "$MESSAGES" "g$round"
    stop_broker
    fresh_schema
done
[[ " $CASES " == *" idle "* ]] && echo "== idle listener: push at batch 100 with the Kafka listener off, then on" && for round in $(seq 1 "$ROUNDS"); do
    for on in false true; do
        QUEEN_KAFKA_ENABLED=$on start_kafka_broker
        echo "kafka=$on $(./target/release/queen-bench --url "$BROKER_URL" push --batch 100 --partitions 8 --concurrency 8 --duration "$DURATION" | grep '^{')"
        stop_broker
        fresh_schema
    done
done
[[ " $CASES " == *" idempotence "* ]] && echo "== librdkafka producing with idempotence off and on" && for round in $(seq 1 "$ROUNDS"); do
    start_kafka_broker
    # Alternate which goes first, so neither always meets the warmer database.
    if (( round % 2 )); then order="plain idempotent"; else order="idempotent plain"; fi
    for mode in $order; do
        "$VENV/bin/python" scripts/lib/kafka-bench.py produce "$KAFKA" "i$round$mode" "$MESSAGES" 100 "$mode"
    done
    stop_broker
    fresh_schema
done
true
