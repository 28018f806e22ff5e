#!/usr/bin/env bash
# Makes sure PostgreSQL's server binaries are on this machine: installs the
# Debian `postgresql` package when they are missing and we are root.
set -euo pipefail
if command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing PostgreSQL (apt-get install postgresql)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
else
    echo "PostgreSQL server binaries are missing: install the 'postgresql' package," >&2
    echo "or point the broker at a database with QUEEN_DATABASE_URL / PG_HOST." >&2
    exit 1
fi
