#!/usr/bin/env bash
# Exporting models larger than memory, at real size (random weights, no download): Wan 2.2
# TI2V-5B's transformer (20 GB fp32, a small text encoder) and, separately, UMT5-XXL's shapes
# (22.7 GB fp32, beside Wan 2.1 1.3B's transformer), each exported --target onnx out of core
# at a small video size under /usr/bin/time (peak RSS), then removed: each folder and its
# package take 20-28 GB of disk apiece.
# Usage: benchmarks/out_of_core.sh [WORKDIR] [STEPS]     (defaults: /tmp/edge-ooc, 2)
set -euo pipefail
work=${1:-/tmp/edge-ooc}
steps=${2:-2}
mkdir -p "$work"
run() {  # NAME SCALE-MODEL-ARGS -- EXPORT-SIZE-ARGS
    local name=$1; shift
    local scale=() size=()
    while [ "$1" != "--" ]; do scale+=("$1"); shift; done; shift
    size=("$@")
    edge scale-model "${scale[@]}" "$work/$name"
    /usr/bin/time -v edge export --model "$work/$name" --out-of-core "${size[@]}" \
        --steps "$steps" -o "$work/$name-onnx" 2>&1 | tee "$work/$name-export.log" \
        | grep -E "^wrote|Maximum resident|Elapsed"
    python - "$work/$name-onnx/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
blocks = [b for c in m["components"] for b in c["blocks"]]
largest = max(blocks, key=lambda b: b["weight_bytes"])
print(f"weights {sum(b['weight_bytes'] for b in blocks) / 1e9:.2f} GB in {len(blocks)} blocks;"
      f" largest {largest['name']} {largest['weight_bytes'] / 1e9:.2f} GB; validation "
      f"{m['validation']}")
PY
    rm -rf "${work:?}/$name" "${work:?}/$name-onnx"
}
run wan22 --like wan2.2-ti2v-5b -- --height 160 --width 256 --frames 5
run umt5xxl --like wan2.1-t2v-1.3b --full-text-encoder -- --height 16 --width 16 --frames 1
