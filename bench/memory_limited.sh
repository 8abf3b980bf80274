#!/usr/bin/env bash
# Run `ds41 bench` on a checkpoint inside a memory cgroup smaller than the checkpoint, to show
# that decode works from the memory-mapped file without a materialised copy: the kernel can
# evict any weight page, and only the run state and scratch buffers are the process's own.
#
#   bench/memory_limited.sh MODEL LIMIT_MIB [ds41 bench options...]
#
# Needs a writable cgroup (v2 `memory.max` or v1 `memory.limit_in_bytes`), e.g. as root in a
# container. Prints the bench report, then the cgroup's peak charge and how often the limit
# forced reclaim. The `ds41` binary is target/release/ds41 (build it first) unless DS41_BIN
# names another.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 MODEL LIMIT_MIB [ds41 bench options...]" >&2
    exit 2
fi
model=$1
limit_mib=$2
shift 2
bin=${DS41_BIN:-$(dirname "$0")/../target/release/ds41}
[ -x "$bin" ] || { echo "$0: no ds41 binary at $bin (cargo build --release)" >&2; exit 2; }
[ -d "$model" ] || { echo "$0: no checkpoint directory $model" >&2; exit 2; }
model_mib=$(du -sm --apparent-size "$model" | cut -f1)

# The cgroup this shell is in, v2 (unified) or v1 (memory controller).
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    parent=/sys/fs/cgroup$(awk -F: '$1 == "0" { print $3 }' /proc/self/cgroup)
    version=2
else
    parent=/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" { print $3 }' /proc/self/cgroup)
    version=1
fi
group=$parent/ds41-bench-$$
mkdir "$group" || { echo "$0: cannot create a cgroup under $parent" >&2; exit 2; }
trap 'rmdir "$group" 2>/dev/null || true' EXIT
limit=$((limit_mib * 1024 * 1024))
if [ $version = 2 ]; then
    echo $limit > "$group/memory.max"
    echo 0 > "$group/memory.swap.max" 2>/dev/null || true
else
    echo $limit > "$group/memory.limit_in_bytes"
fi

# Pages already cached stay charged to whoever read them first: drop the checkpoint's pages
# from the page cache so the run under the limit reads (and is charged for) every one.
find "$model" -type f -exec dd if={} iflag=nocache count=0 status=none \;

echo "checkpoint $model: $model_mib MiB; memory limit $limit_mib MiB (cgroup v$version)"
# The subshell moves itself into the group, then becomes the bench.
(echo $BASHPID > "$group/cgroup.procs"; exec "$bin" bench --model "$model" "$@")

if [ $version = 2 ]; then
    peak=$(cat "$group/memory.peak" 2>/dev/null || echo 0)
    reclaim=$(awk '$1 == "max" { print $2 }' "$group/memory.events")
else
    peak=$(cat "$group/memory.max_usage_in_bytes")
    reclaim=$(cat "$group/memory.failcnt")
fi
echo "cgroup     peak charge $((peak / 1048576)) MiB of $limit_mib MiB (page cache included); limit reached $reclaim times"
