#!/usr/bin/env bash
# Kafka's own clients against the broker's Kafka listener (tests/kafka):
# confluent-kafka (librdkafka), kafka-python, aiokafka, kafkajs and Debian's
# kcat. Starts a private
# PostgreSQL cluster; every test gets its own database and broker process.
# Extra arguments go to pytest (e.g. -k group).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
if ! command -v kcat >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >/dev/null
    else
        echo "kcat is needed for the Kafka client tests (apt-get install kcat)" >&2; exit 1
    fi
fi
# kafkajs, pinned by tests/kafka/js/package-lock.json (Node.js and npm from Debian when missing).
if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    else
        echo "Node.js and npm are needed for the kafkajs test (apt-get install nodejs npm)" >&2; exit 1
    fi
fi
if ! cmp -s tests/kafka/js/package-lock.json tests/kafka/js/node_modules/.package-lock.json 2>/dev/null; then
    (cd tests/kafka/js && npm ci --no-audit --no-fund --silent)
fi
source scripts/lib/pytest-suite.sh
run_pytest_suite kafka 5433 "$@"
