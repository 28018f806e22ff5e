#!/usr/bin/env bash
# Starts the broker. With no database configured it runs its own PostgreSQL
# cluster under QUEEN_DATA_DIR (default ./queen-data).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
exec cargo run --locked --release --bin queen -- serve "$@"
