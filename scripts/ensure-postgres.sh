#!/usr/bin/env bash
# Makes sure PostgreSQL's server binaries are on this machine, and the
# `openssl` tool the TLS tests make their certificates with: installs the
# Debian packages `postgresql` and `openssl` when they are missing and we are
# root.
set -euo pipefail
missing=()
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    missing+=(postgresql)
fi
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
[ ${#missing[@]} = 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} (apt-get install)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "missing: ${missing[*]}. Install the Debian package(s) of that name," >&2
    echo "or point the broker at a database with QUEEN_DATABASE_URL / PG_HOST." >&2
    exit 1
fi
