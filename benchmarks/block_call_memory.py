"""What one block call holds in onnxruntime at a video size, measured: one block of a family
folder exported as `edge export --target onnx` exports it (the budget's attention chunks,
fused attention where it has no mask) and run as the Python runtime runs it under a budget
(a call's batch of 1, no arena, no memory pattern), in a fresh process.

    python benchmarks/block_call_memory.py FOLDER --height 480 --width 832 --frames 81 \\
        --block transformer/block_0 --memory-budget 1.33GB

Prints the dry run's estimate of the call's activations (edge/planning/activation_memory.py) beside
the measured peak: RSS above the process before the call (inputs and weights in memory
already; Linux's peak counter reset through /proc/self/clear_refs), and the call's wall. No
export of the whole model is needed: a 480x832x81 transformer block is minutes, the whole
export hours here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from process_memory import reset_peak_rss, status_bytes  # benchmarks/: run as scripts


def export_block(folder: Path, size: dict, key: str, budget: int, out: Path) -> dict:
    """The block's graph and weights under `out`; its signature and estimate."""
    import numpy as np

    from edge.exporters.shared.onnx_graph import export_graph
    from edge.families import load_model
    from edge.graph.attention import budget_score_limit
    from edge.planning.activation_memory import activation_peak

    model = load_model(folder, steps=1, **size)
    blocks = {b.key: b for comp in model.cut(model.shapes("onnx")).values() for b in comp}
    if key not in blocks:
        raise SystemExit(f"no block {key}; blocks: {', '.join(blocks)}")
    block = blocks[key]
    with budget_score_limit(budget):
        started = time.perf_counter()
        export_graph(block, out / "block.onnx")
        estimate = activation_peak(block, batch=1)
    exported_s = time.perf_counter() - started
    weights = {n: p.detach().numpy() for n, p in block.parameters().items()}
    np.savez(out / "weights.npz", **weights)
    np.savez(out / "inputs.npz", **{n: t[:1].numpy() if d else t.numpy() for n, t, d in zip(
        block.inputs, block.example, block.dynamic_batch, strict=True)})
    return {"block": key, "export_s": exported_s, "estimate_bytes": estimate,
            "weight_bytes": sum(w.nbytes for w in weights.values())}


def run_block(out: Path) -> dict:
    """In this process: the graph run once on batch 1, its peak RSS over the start."""
    import numpy as np
    import onnxruntime as ort

    from edge.runtimes.python.sessions import session_options

    session = ort.InferenceSession(str(out / "block.onnx"), session_options(),
                                   providers=["CPUExecutionProvider"])
    inputs = dict(np.load(out / "inputs.npz"))
    names = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in (inputs | dict(np.load(out / "weights.npz"))).items()
             if k in names}

    before = reset_peak_rss()
    started = time.perf_counter()
    outputs = session.run(None, feeds)
    wall = time.perf_counter() - started
    peak = status_bytes("VmHWM")
    return {"call_s": wall, "rss_before_bytes": before, "peak_rss_bytes": peak,
            "call_peak_bytes": peak - before,
            "inputs_bytes": sum(v.nbytes for v in inputs.values()),
            "outputs_bytes": sum(o.nbytes for o in outputs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--block", default="transformer/block_0")
    parser.add_argument("--memory-budget", default="1.33GB")
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # the measuring child
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_block(args.run)))
        return
    from edge.core.budget import parse_size

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        size = {"height": args.height, "width": args.width, "frames": args.frames}
        record = size | export_block(args.folder, size, args.block,
                                     parse_size(args.memory_budget, "memory_budget"), out)
        child = subprocess.run([sys.executable, __file__, "--run", str(out)], check=True,
                               capture_output=True, text=True)
        record |= json.loads(child.stdout.strip().splitlines()[-1])
    print(json.dumps(record, indent=1))
    gib = 2 ** 30
    print(f"{record['block']} at {args.height}x{args.width}x{args.frames}: the call peaked at "
          f"{record['call_peak_bytes'] / gib:.2f} GiB over what was resident before it "
          f"(estimate {record['estimate_bytes'] / gib:.2f} GiB), {record['call_s']:.0f} s")


if __name__ == "__main__":
    main()
