# Sourced: runs a Python suite of tests/SUITE against the debug broker (the
# real `queen` binary), on a private PostgreSQL cluster that this starts on
# PORT and removes on exit; every test of the suite makes its own database
# and broker process (tests/compat/conftest.py). The suite's virtualenv is
# target/SUITE-venv, pinned by tests/SUITE/requirements.txt.
# Usage: run_pytest_suite SUITE PORT [pytest arguments...]
run_pytest_suite() {
    local suite=$1 port=$2
    shift 2
    cargo build --locked --bin queen -q
    local venv=target/$suite-venv
    source scripts/lib/venv.sh
    ensure_venv "$venv" "tests/$suite/requirements.txt"
    source scripts/lib/pg-cluster.sh
    start_pg_cluster "$port" "-c fsync=off -c synchronous_commit=off"
    trap stop_pg_cluster EXIT
    QUEEN_COMPAT_PG_DIR=$PG_DIR QUEEN_COMPAT_PG_PORT=$PG_PORT QUEEN_BIN=$PWD/target/debug/queen \
        QUEEN_COMPAT_PSQL=$PG_BIN/psql "$venv/bin/python" -m pytest -q -p no:cacheprovider "tests/$suite" "$@"
}
