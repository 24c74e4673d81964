#!/usr/bin/env bash
# Streaming figures on a ~1 GB transformer (tiny-sora's architecture, random weights):
# export it, then bench it at 25% of its weight bytes. Prints edge bench's table and JSON.
# Usage: benchmarks/streaming.sh [WORKDIR] [STEPS]     (defaults: /tmp/edge-bench, 10)
set -euo pipefail
work=${1:-/tmp/edge-bench}
steps=${2:-10}
mkdir -p "$work"
[ -d "$work/sora-1g" ] || edge scale-model "$work/sora-1g" --hidden 1024 --pairs 8 --heads 16
[ -d "$work/sora-1g-onnx" ] || edge export --model "$work/sora-1g" -o "$work/sora-1g-onnx"
total=$(du -sb "$work/sora-1g-onnx/weights" | cut -f1)
budget=$((total / 4))
echo "package weights: $total bytes; budget (25%): $budget bytes"
edge bench "$work/sora-1g-onnx" --memory-budget "$budget" --steps "$steps" --json | tee "$work/bench.json"
