# Sourced after bench-cluster.sh and start_broker: `sampled ARGS...` runs
# queen-bench ARGS against the broker and prints its output, the CPU seconds
# by process per message (scripts/lib/cpu-sample.py) and the WAL bytes
# PostgreSQL wrote per message. With AFTER set, sampling starts when that
# text appears in the bench's output (after a prefill).
SAMPLED_OUT=$DIR/bench.out
wal_lsn() { "${PSQL[@]}" -At -c "SELECT pg_current_wal_lsn()"; }
sampled() {
    ./target/release/queen-bench --url "$BROKER_URL" "$@" > "$SAMPLED_OUT" &
    local pid=$!
    (
        for _ in $(seq 1 60000); do
            if [ -z "${AFTER:-}" ] || grep -q "$AFTER" "$SAMPLED_OUT" 2>/dev/null; then break; fi
            sleep 0.01
        done
        wal_lsn > "$DIR/start.lsn"
    ) &
    local marker=$!
    local cpu wal messages
    cpu=$(python3 scripts/lib/cpu-sample.py "$SAMPLED_OUT" "$BROKER_PID" ${AFTER:+--after "$AFTER"})
    wait "$pid"
    wait "$marker"
    wal=$("${PSQL[@]}" -At -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$(cat "$DIR/start.lsn")')::bigint")
    cat "$SAMPLED_OUT"
    echo "$cpu"
    messages=$(sed -n 's/.*"messages":\([0-9]*\).*/\1/p' "$SAMPLED_OUT" | tail -1)
    echo "wal bytes per message $(awk -v w="$wal" -v m="$messages" 'BEGIN { printf "%.0f", w / m }') ($wal over $messages)"
}
