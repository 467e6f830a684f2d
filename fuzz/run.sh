#!/usr/bin/env bash
# Runs every fuzz target for N seconds (default 60): fuzz/run.sh [seconds] [target...]
# Needs cargo-fuzz (`cargo install cargo-fuzz`); runs on the stable toolchain through
# RUSTC_BOOTSTRAP=1. A crash stops the run (exit 1) with the input under
# fuzz/artifacts/<target>/; turn it into a regression unit test next to the code it broke.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode_client decode_server roundtrip session)
export RUSTC_BOOTSTRAP=1
cargo fuzz build
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    # Seeds are one protocol op per file; the decoder targets read a small header first
    # (2 split points at 3 and 9, headers on).
    if [ -d "seeds/$t" ]; then
        for f in seeds/"$t"/*; do
            { printf '\002\003\000\011\000\001'; cat "$f"; } > "corpus/$t/seed-$(basename "$f")"
        done
    fi
    echo "== $t: ${secs}s"
    log=$(mktemp)
    rc=0
    cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1 || rc=$?
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || true
    if [ "$rc" -ne 0 ]; then
        tail -40 "$log" >&2
        echo "fuzz target $t failed (exit $rc): see fuzz/artifacts/$t" >&2
        exit 1
    fi
    rm -f "$log"
done
