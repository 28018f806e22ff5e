#!/usr/bin/env bash
# The whole test suite. Each test binary starts its own private PostgreSQL
# cluster (as the postgres user when run as root) and one database per test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
cargo test --locked "$@"
