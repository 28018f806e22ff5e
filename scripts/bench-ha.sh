#!/usr/bin/env bash
# Failovers of a Patroni-managed PostgreSQL under load (docs/PERFORMANCE.md,
# issue 50): tests/ha.rs in a release build, every fault REPEAT times
# (default 5) on one cluster of three etcd members and three PostgreSQL nodes
# (scripts/ha/cluster.sh), with synchronous replication, then the leader kill
# again with synchronous_mode_strict and with asynchronous replication (what
# the lag costs). Run nothing else meanwhile: the write gaps are times. Prints one
# table row per fault: acknowledged writes (pushes answered 201), lost,
# duplicates, and the write gap (the longest time after the fault with no
# push written to PostgreSQL) p50 and max. Localhost only.
set -euo pipefail
cd "$(dirname "$0")/.."
REPEAT=${REPEAT:-5}
FAULTS=${FAULTS:-kill-leader,kill-leader-postgres,switchover,stop-leader,vanish-leader,delay,kill-etcd-leader,kill-broker-in-failover}
STRICT_FAULTS=${STRICT_FAULTS:-kill-leader}
ASYNC_FAULTS=${ASYNC_FAULTS:-kill-leader}
bash scripts/ha/cluster.sh install
LOG=$(mktemp /tmp/bench-ha-XXXX.log)
run() {
    QUEEN_HA_MODE=$1 QUEEN_HA_FAULTS=$2 QUEEN_HA_REPEAT=$REPEAT \
        cargo test --release --locked -q --test ha -- --nocapture 2>&1 | tee -a "$LOG" | grep -o 'HA-RESULT.*' || true
}
run sync "$FAULTS"
[ -n "$STRICT_FAULTS" ] && run strict "$STRICT_FAULTS"
[ -n "$ASYNC_FAULTS" ] && run async "$ASYNC_FAULTS"
python3 - "$LOG" <<'EOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if "HA-RESULT" not in line:
        continue
    line = line[line.index("HA-RESULT"):]
    kv = dict(re.findall(r"(\w+)=(\S+)", line.split(" (")[0]))
    rows.setdefault((kv["mode"], kv["fault"]), []).append(kv)
print("| replication | fault | runs | acknowledged writes | lost | duplicates | acked then redelivered | write gap p50 | write gap max |")
print("|---|---|---|---|---|---|---|---|---|")
for (mode, fault), rs in rows.items():
    gaps = [int(r["write_gap_ms"]) / 1000 for r in rs]
    s = lambda k: sum(int(r[k]) for r in rs)
    print(f"| {mode} | {fault} | {len(rs)} | {s('answered'):,} | {s('lost')} | {s('duplicates')} | "
          f"{s('redelivered_after_ack')} | {statistics.median(gaps):.1f} s | {max(gaps):.1f} s |")
EOF
echo "full log: $LOG"
