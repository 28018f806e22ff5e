#!/usr/bin/env bash
# The whole test suite: the Rust tests (each test binary starts its own
# private PostgreSQL cluster, as the postgres user when run as root, with one
# database per test; tests/ha.rs starts etcd, Patroni and HAProxy), then the
# conformance suite of the official Python client, then Kafka's clients
# (confluent-kafka, kcat) on the Kafka port.
# Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
# Patroni, etcd and HAProxy for tests/ha.rs (Debian packages).
bash scripts/ha/cluster.sh install
cargo test --locked "$@"
# The official Python client against the real broker (tests/compat).
bash scripts/compat.sh
# Kafka's own clients against the broker's Kafka listener (tests/kafka).
bash scripts/kafka.sh
