#!/bin/sh
# Run a fuzzing campaign over every target (or the ones named) and print the README's table.
# Each target runs until it has made RUNS executions or spent SECONDS of wall time, whichever
# comes first; JOBS targets run side by side. Findings land in fuzz/artifacts/TARGET/.
#
#   fuzz/seed-corpora.sh                     # once, on a fresh checkout
#   cargo +nightly fuzz build -s none        # from fuzz/
#   fuzz/campaign.sh                         # all targets, 1 M runs or 30 min each, 2 at a time
#   RUNS=100000 SECONDS_PER_TARGET=60 JOBS=1 fuzz/campaign.sh dsml_strict yaml_case
#
# Logs: fuzz/logs/TARGET.log; the table is printed at the end and kept in fuzz/logs/table.md.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/target/x86_64-unknown-linux-gnu/release
runs=${RUNS:-1000000}
seconds=${SECONDS_PER_TARGET:-1800}
jobs=${JOBS:-2}
logs=$here/logs
mkdir -p "$logs"
if [ $# -eq 0 ]; then
    set -- $(ls "$here/fuzz_targets" | sed 's/\.rs$//')
fi
for t in "$@"; do
    [ -x "$bin/$t" ] || { echo "no binary $bin/$t: run \`cargo +nightly fuzz build -s none\` in fuzz/" >&2; exit 2; }
done

run_one() { # run_one TARGET: one libFuzzer run, its summary line in logs/TARGET.result
    t=$1
    mkdir -p "$here/corpus/$t" "$here/artifacts/$t"
    start=$(date +%s)
    set +e
    "$bin/$t" "$here/corpus/$t" -runs="$runs" -max_total_time="$seconds" -timeout=20 \
        -rss_limit_mb=3072 -artifact_prefix="$here/artifacts/$t/" -print_final_stats=1 \
        > "$logs/$t.log" 2>&1
    status=$?
    set -e
    took=$(( $(date +%s) - start ))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)
    found=$(ls "$here/artifacts/$t" | wc -l)
    echo "$t $took ${execs:-0} $found $status" > "$logs/$t.result"
}

# A simple pool: start up to $jobs targets, wait for the oldest, start the next.
pids=""
for t in "$@"; do
    run_one "$t" &
    pids="$pids $!"
    set -- $pids
    if [ $# -ge "$jobs" ]; then
        wait "$1"
        shift
        pids="$*"
    fi
done
for p in $pids; do wait "$p"; done

{
    echo "| target | time | executions | findings |"
    echo "| --- | --- | --- | --- |"
    for f in "$logs"/*.result; do
        read -r t took execs found status < "$f"
        printf '| `%s` | %s s | %s | %s (exit %s) |\n' "$t" "$took" \
            "$(printf '%s' "$execs" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta')" "$found" "$status"
    done
} | tee "$logs/table.md"
