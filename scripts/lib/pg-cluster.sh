# Sourced: a private PostgreSQL cluster on a unix socket in a temp dir, run
# as the postgres user when we are root, stopped and removed on exit.
# Usage: start_pg_cluster PORT "EXTRA SERVER OPTIONS"; sets PG_BIN, PG_DIR.
start_pg_cluster() {
    local port=$1 extra=${2:-}
    PG_BIN=$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")
    PG_DIR=$(mktemp -d /tmp/queen-pg-XXXXXX)
    PG_AS=()
    if [ "$(id -u)" = 0 ]; then chown postgres: "$PG_DIR"; PG_AS=(runuser -u postgres --); fi
    "${PG_AS[@]}" "$PG_BIN/initdb" -D "$PG_DIR/pgdata" -U postgres -A trust -E UTF8 --locale=C --no-sync >/dev/null
    "${PG_AS[@]}" "$PG_BIN/pg_ctl" start -D "$PG_DIR/pgdata" -w -s -l "$PG_DIR/pg.log" \
        -o "-c listen_addresses='' -k $PG_DIR -p $port -c max_connections=300 -c TimeZone=UTC $extra"
    PG_PORT=$port
}

stop_pg_cluster() {
    if [ -n "${PG_DIR:-}" ]; then
        "${PG_AS[@]}" "$PG_BIN/pg_ctl" stop -D "$PG_DIR/pgdata" -m fast -s || true
        rm -rf "$PG_DIR"
    fi
}
