"""What one attention costs onnxruntime (CPU) in memory and time, exported three ways, side by
side in one run: whole (PyTorch's SDPA as the exporter writes it out: MatMul, Softmax, MatMul
over the full score matrix), chunked (edge/graph/attention.py: query chunks of at most the default
score limit) and fused (onnxruntime's MultiHeadAttention, what `--target onnx` exports for
attention without a mask).

    python benchmarks/attention_memory.py            # 16 384 tokens, 4 heads
    python benchmarks/attention_memory.py --tokens 7800 --heads 12 --head-dim 128
                                                     # Wan 1.3B's self-attention at 480x832x17

Each way runs in a fresh process (peak RSS is per process), once to warm up and once timed;
the table gives its peak RSS above the process before the session was made, the time of the
timed run, and its max-abs error against PyTorch's SDPA.
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

WAYS = ("whole", "chunked", "fused")


def export(way: str, tokens: int, heads: int, head_dim: int, path: Path) -> None:
    import torch
    import torch.nn.functional as F

    from edge.exporters.shared.onnx_graph import export_graph
    from edge.graph.attention import DEFAULT_SCORE_BYTES, score_limit
    from edge.graph.blocks import Block

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

    g = torch.Generator().manual_seed(0)
    qkv = tuple(torch.randn(1, heads, tokens, head_dim, generator=g) for _ in range(3))
    block = Block("bench", "attention", Attention(), ["q", "k", "v"], ["out"], qkv,
                  [True] * 3)
    # "whole": a limit no attention reaches, so nothing is chunked
    limit = 2**62 if way == "whole" else DEFAULT_SCORE_BYTES
    with score_limit(limit):
        export_graph(block, path, fused_attention=way == "fused")
    torch.save(qkv, path.with_suffix(".pt"))


def run(path: Path) -> dict:
    """In this (fresh) process: the graph on its inputs; peak RSS added, time, error."""
    import numpy as np
    import onnxruntime as ort
    import torch

    q, k, v = torch.load(path.with_suffix(".pt"))
    feeds = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()}
    before = reset_peak_rss()  # the imports' own peak is not the attention's
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    start = time.perf_counter()
    got = session.run(None, feeds)[0]
    seconds = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v).numpy()  # after the peak
    return {"peak_added": peak - before, "seconds": seconds,
            "error": float(np.abs(got - want).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16_384)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run(args.run)))
        return
    from edge.core.budget import format_size

    score = args.heads * args.tokens**2 * 4
    print(f"one attention, {args.tokens} tokens x {args.heads} heads x {args.head_dim}: "
          f"its score matrix {format_size(score)}")
    with tempfile.TemporaryDirectory() as tmp:
        for way in WAYS:
            path = Path(tmp) / f"{way}.onnx"
            export(way, args.tokens, args.heads, args.head_dim, path)
            out = subprocess.run([sys.executable, __file__, "--run", str(path)],
                                 capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{way:8s} peak RSS added {format_size(got['peak_added']):>10s}   "
                  f"{got['seconds']:6.2f} s   max-abs error {got['error']:.1e}", flush=True)


if __name__ == "__main__":
    main()
