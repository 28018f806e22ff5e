#!/usr/bin/env bash
# Bounded fuzzing (cargo fuzz, libFuzzer) of the frame codec, the QPB1/QTB1
# parsers and the Kafka record batches, from the seed corpus in fuzz/corpus.
# SECONDS_PER_TARGET (default
# 60) each. A crash fails the run and leaves its input in
# fuzz/artifacts/<target>/: turn it into a regression test in src/log.
#
# cargo fuzz needs compiler flags that stable Rust guards; this project has
# only the stable toolchain, so RUSTC_BOOTSTRAP=1 unlocks them, and the
# targets run without a sanitizer (the parsers are safe Rust: a sanitizer
# would watch for memory errors they cannot make; panics and failed
# assertions are what the fuzzer catches).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECONDS_PER_TARGET:-60}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked -q
export RUSTC_BOOTSTRAP=1
for target in frame_codec qpb1 qtb1 kafka_batch; do
    mkdir -p "fuzz/corpus-work/$target"
    echo "== fuzzing $target for ${SECS}s"
    cargo fuzz run --sanitizer none "$target" "fuzz/corpus-work/$target" "fuzz/corpus/$target" -- \
        -max_total_time="$SECS" -rss_limit_mb=2048 -print_final_stats=1 2>&1 | grep -E "^(==|Done|stat::number_of_executed_units|INFO: seed corpus)|ERROR|panicked|SUMMARY" || true
    if [ -n "$(ls -A "fuzz/artifacts/$target" 2>/dev/null)" ]; then
        echo "fuzz target $target found a crash: see fuzz/artifacts/$target" >&2
        exit 1
    fi
done
echo "fuzzing: 0 crashes"
