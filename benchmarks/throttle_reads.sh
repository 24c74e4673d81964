#!/usr/bin/env bash
# Run a command with storage reads capped at a given bandwidth, to measure streaming against a
# known, slower storage device than this VM's disk (whose "cold" O_DIRECT reads the hypervisor
# may serve from its own cache). Uses the cgroup v1 blkio throttle of the kernel, which limits
# reads that reach the block device (O_DIRECT ones included); needs root. Children inherit it.
# The cap is on the average rate: the kernel lets a read that follows an idle spell use the
# time the group left unused, so a reader that idles between reads can exceed the cap for a
# while. Check the achieved read bandwidth a benchmark prints before trusting a throttled run.
#
#   benchmarks/throttle_reads.sh BYTES_PER_S COMMAND [ARGS...]
#   benchmarks/throttle_reads.sh 750000000 edge bench /tmp/edge-bench/sora-1g-onnx \
#       --memory-budget 302449664 --steps 10 --json
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 BYTES_PER_S COMMAND [ARGS...]" >&2
    exit 2
fi
bps=$1
shift
blkio=/sys/fs/cgroup/blkio
if [ ! -w "$blkio" ]; then
    echo "$0: $blkio is not writable (needs root and cgroup v1 blkio)" >&2
    exit 2
fi
# the device that holds the first file argument's folder, else the working directory
target=.
for a in "$@"; do if [ -e "$a" ]; then target=$a; break; fi; done
dev=$(stat -c '%d' "$target")                  # st_dev of the file system
major=$((dev >> 8)); minor=$((dev & 0xff))
# a partition's throttle goes on its whole disk (the block device the I/O is queued on)
sysdev=$(readlink -f "/sys/dev/block/$major:$minor")
[ -f "$sysdev/partition" ] && sysdev=$(dirname "$sysdev")
majmin=$(cat "$sysdev/dev")
group="$blkio/edge-throttle-$$"
mkdir "$group"
# the group can be removed once empty: helper processes of the command may outlive it briefly
remove_group() { for _ in $(seq 50); do rmdir "$group" 2>/dev/null && return; sleep 0.1; done; }
trap remove_group EXIT
echo "$majmin $bps" > "$group/blkio.throttle.read_bps_device"
echo "reads from block device $majmin capped at $bps bytes/s" >&2
# the command runs in a child that joins the group first, so this shell can remove it after
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$group" "$@"
