#!/usr/bin/env python3
"""Mean time per stage between two scrapes of /metrics/prometheus.

Usage: stages.py BEFORE AFTER [FAMILY...]

The broker times each stage of a push, an ack and a claim in histograms
labelled `stage` (queen_push_stage_seconds, queen_ack_stage_seconds,
queen_pop_stage_seconds; docs/OPERATIONS.md). A bench scrapes before and
after a run and prints, per family and stage, how many samples the run
added and their mean in milliseconds: where its requests waited, beside
its rate. FAMILY names default to the ack and pop families.
"""
import re
import sys

SAMPLE = re.compile(r'^(\w+)_(sum|count)\{stage="(\w+)"\} (\S+)$')


def load(path):
    out = {}
    with open(path) as f:
        for line in f:
            m = SAMPLE.match(line.strip())
            if m:
                out[(m.group(1), m.group(3), m.group(2))] = float(m.group(4))
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    before, after = load(sys.argv[1]), load(sys.argv[2])
    families = sys.argv[3:] or ["queen_ack_stage_seconds", "queen_pop_stage_seconds"]
    parts = []
    for family in families:
        stages = sorted({s for (f, s, _) in after if f == family})
        for stage in stages:
            n = after.get((family, stage, "count"), 0) - before.get((family, stage, "count"), 0)
            total = after.get((family, stage, "sum"), 0) - before.get((family, stage, "sum"), 0)
            if n > 0:
                short = family.removeprefix("queen_").removesuffix("_stage_seconds")
                parts.append(f"{short} {stage} {1000 * total / n:.2f} ms ({n:.0f})")
    print("stages, mean per sample: " + ("; ".join(parts) if parts else "none"))


if __name__ == "__main__":
    main()
