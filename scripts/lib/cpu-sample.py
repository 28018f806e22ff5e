"""CPU seconds by process while one queen-bench run works (docs/PERFORMANCE.md).

Why: on a shared two-core machine msg/s scatters by +-15 % from run to run,
while the CPU each process spends per message scatters less, and it says
where a change saved work: the broker, PostgreSQL or the load generator.

Usage: cpu-sample.py BENCH_OUTPUT BROKER_PID [--after TEXT]
Samples /proc every 10 ms from the moment TEXT appears in BENCH_OUTPUT (at
once without --after) until no queen-bench process is left, then prints one
line: wall seconds, the machine's busy and available CPU seconds, and the
CPU seconds of the broker, of every postgres process and of queen-bench; then
the same per message, from the count in the bench's JSON line. A process that
exits between samples loses at most its last 10 ms.
"""
import json
import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def cpu_of(pid):
    """utime + stime of one process, in seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / HZ
    except (OSError, IndexError, ValueError):
        return None


def comm_of(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def snapshot(broker):
    """Per-process CPU of the three groups, the machine's counters, the time."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        comm = comm_of(pid)
        group = "broker" if pid == broker else "postgres" if comm == "postgres" else "bench" if comm.startswith("queen-bench") else None
        t = cpu_of(pid) if group else None
        if t is not None:
            procs[pid] = (group, t)
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return procs, sum(ticks) / HZ, (ticks[3] + ticks[4]) / HZ, time.monotonic()


def bench_in(snap):
    return any(group == "bench" for group, _ in snap[0].values())


def main():
    out, broker = sys.argv[1], int(sys.argv[2])
    after = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--after" else None
    deadline = time.monotonic() + 3600  # every loop is bounded
    first = snapshot(broker)
    while time.monotonic() < deadline:
        if after is None and bench_in(first):
            break
        if after and os.path.exists(out) and after in open(out).read():
            break
        time.sleep(0.01)
        first = snapshot(broker)
    last = first
    latest = dict(first[0])  # a process keeps its last reading after it exits
    while bench_in(last) and time.monotonic() < deadline:
        time.sleep(0.01)
        last = snapshot(broker)
        latest.update(last[0])
    spent = {"broker": 0.0, "postgres": 0.0, "bench": 0.0}
    for pid, (group, t) in latest.items():
        before = first[0].get(pid)
        spent[group] += t - (before[1] if before else 0.0)
    total, idle = last[1] - first[1], last[2] - first[2]
    busy = total - idle
    print(f"cpu wall {last[3] - first[3]:.2f}s  machine busy {busy:.2f} of {total:.2f} cpu-s  "
          f"broker {spent['broker']:.2f}  postgres {spent['postgres']:.2f}  bench {spent['bench']:.2f}")
    # Per message, from the count in the bench's JSON line.
    messages = 0
    for line in open(out):
        if line.startswith("{"):
            messages = json.loads(line).get("messages", 0)
    if messages:
        per = lambda s: s / messages * 1e6
        print(f"cpu us/msg  machine {per(busy):.2f}  broker {per(spent['broker']):.2f}  "
              f"postgres {per(spent['postgres']):.2f}  bench {per(spent['bench']):.2f}")


if __name__ == "__main__":
    main()
