#!/usr/bin/env bash
# Compare two builds of `ds41` on the same checkpoint, their runs interleaved (A, B, A, B, ...)
# so that both see the same machine state: on a shared or throttled machine the speed drifts
# over minutes, and only runs made side by side can be compared.
#
#   bench/paired.sh BIN_A BIN_B ROUNDS [ds41 bench options...]
#
# e.g. bench/paired.sh /tmp/ds41-old target/release/ds41 3 --model /tmp/wide --tokens 12
# Prints each run's prefill, warm prefill and decode lines, prefixed with the round and the binary.
set -euo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 BIN_A BIN_B ROUNDS [ds41 bench options...]" >&2
    exit 2
fi
a=$1
b=$2
rounds=$3
shift 3
for bin in "$a" "$b"; do
    if [ ! -x "$bin" ]; then
        echo "$0: $bin is not an executable" >&2
        exit 2
    fi
done
for round in $(seq 1 "$rounds"); do
    for bin in "$a" "$b"; do
        "$bin" bench "$@" | grep -E '^(prefill|decode) |^  warm ' | sed "s|^|round $round  $bin  |"
    done
done
