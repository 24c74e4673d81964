#!/usr/bin/env bash
# Streaming figures at Wan2.1-T2V-1.3B's real size (random weights, no download): write the
# folder, export it at two video sizes with a budget of 25% of the transformer's bytes
# (the export prints its peak RSS), and bench each: resident, streamed, naive, cold read.
#   small: 1 frame 16x16: little compute per step, the run waits on storage where it is slow
#   large: 17 frames 128x128 (320 video tokens): compute per step exceeds the cold read of
#          the streamed bytes
# Usage: benchmarks/wan_streaming.sh [WORKDIR] [STEPS]     (defaults: /tmp/edge-wan, 3)
# Slower storage: run it under benchmarks/throttle_reads.sh (see docs/benchmarks.md).
set -euo pipefail
work=${1:-/tmp/edge-wan}
steps=${2:-3}
mkdir -p "$work"
[ -d "$work/wan13" ] || edge scale-model --like wan2.1-t2v-1.3b "$work/wan13"
transformer=$(cat "$work"/wan13/transformer/*.safetensors | wc -c)
budget=$((transformer / 4))
echo "transformer: $transformer bytes; budget (25%): $budget bytes"
for size in "16 16 1" "128 128 17"; do
    read -r height width frames <<< "$size"
    name="wan13-${height}x${width}x${frames}"
    [ -d "$work/$name" ] || edge export --model "$work/wan13" --height "$height" \
        --width "$width" --frames "$frames" --steps "$steps" --memory-budget "$budget" \
        -o "$work/$name"
    edge bench "$work/$name" --memory-budget "$budget" --steps "$steps" --json \
        | tee "$work/$name.json"
done
