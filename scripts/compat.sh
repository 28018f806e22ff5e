#!/usr/bin/env bash
# The conformance suite: the official Python client queen-mq 2.6.0, unmodified,
# against this broker (tests/compat). Starts a private PostgreSQL cluster;
# every test gets its own database and its own broker process.
# Extra arguments go to pytest (e.g. -k leases).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-postgres.sh
# The dashboard's browser test drives Debian's Chromium with its chromedriver.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "chromium and chromium-driver are needed for the dashboard test (apt-get install chromium chromium-driver)" >&2; exit 1
    fi
fi
source scripts/lib/pytest-suite.sh
run_pytest_suite compat 5432 "$@"
