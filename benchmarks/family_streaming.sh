#!/usr/bin/env bash
# Streaming figures for one family at its real transformer shapes (random weights, no
# download): write the folder (`edge scale-model --like LIKE`), export it at a small video
# size with a budget of 25% of the transformer's bytes, and bench it (resident, streamed,
# naive, cold read); then remove the folder and the package.
# Usage: benchmarks/family_streaming.sh LIKE HEIGHT WIDTH FRAMES [WORKDIR] [STEPS] [BENCH OPTIONS]
#   e.g. benchmarks/family_streaming.sh cogvideox-2b 64 64 9 /tmp/edge-family 3 --lean
#        benchmarks/family_streaming.sh ltx-video-2b 64 64 9
# (Wan 2.1's figures: benchmarks/wan_streaming.sh.)
set -euo pipefail
like=$1 height=$2 width=$3 frames=$4
work=${5:-/tmp/edge-family}
steps=${6:-3}
name="$like-${height}x${width}x${frames}"
mkdir -p "$work"
[ -d "$work/$like" ] || edge scale-model --like "$like" "$work/$like"
transformer=$(cat "$work/$like"/transformer/*.safetensors | wc -c)
budget=$((transformer / 4))
echo "transformer: $transformer bytes; budget (25%): $budget bytes"
[ -d "$work/$name" ] || /usr/bin/time -v edge export --model "$work/$like" --height "$height" \
    --width "$width" --frames "$frames" --steps "$steps" --memory-budget "$budget" \
    -o "$work/$name" 2>&1 | grep -E "^wrote|Maximum resident|Elapsed"
edge bench "$work/$name" --memory-budget "$budget" --steps "$steps" --json "${@:7}" \
    | tee "$work/$name.json"
rm -rf "${work:?}/$like" "${work:?}/$name"
