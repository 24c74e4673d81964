"""Weights as graph inputs (what edge exports) against weights as initializers in external
data (ONNX's usual way), on one block of an exported package, side by side in one run.

    python benchmarks/weights_as_inputs.py PACKAGE [BLOCK] [RUNS]
    e.g. python benchmarks/weights_as_inputs.py /tmp/edge-bench/sora-1g-onnx transformer/pair_0

Prints, for each layout: the time to make the block runnable from storage (inputs: read the
weights file cold; initializers: create a session, which reads the external data) and the
time of one run once loaded (median of RUNS).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from edge.runtimes.python.loader import BlockWeights, read_file, tensors_from


def main(package: Path, key: str, runs: int) -> None:
    manifest = json.loads((package / "manifest.json").read_text())
    comp, name = key.split("/")
    block = next(b for c in manifest["components"] if c["name"] == comp
                 for b in c["blocks"] if b["name"] == name)
    wpath = package / block["weights"]["path"]
    spec = BlockWeights.of_block(key, wpath, block)
    rng = np.random.default_rng(0)
    feed = {s["name"]: rng.standard_normal([2 if d == "batch" else d for d in s["shape"]],
                                           dtype=np.float32)
            for s in block["inputs"]}
    outputs = [f"out:{s['name']}" for s in block["outputs"]]
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = False

    # layout 1: weights as inputs (edge): load = one cold read of the weights file
    started = time.perf_counter()
    weights = tensors_from(read_file(wpath, spec.nbytes, cold=True), spec)
    load_inputs = time.perf_counter() - started
    session = ort.InferenceSession(str(package / block["graph"]), options,
                                   providers=["CPUExecutionProvider"])
    run_inputs = _median_run(session, outputs, feed | weights, runs)

    # layout 2: the same graph with the weights as initializers in external data
    model = onnx.load(str(package / block["graph"]))
    names = set(weights)
    kept = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(np.ascontiguousarray(a), n)
                                   for n, a in weights.items())
    with tempfile.TemporaryDirectory(dir=package.parent) as tmp:
        path = Path(tmp) / "block.onnx"
        onnx.save(model, str(path), save_as_external_data=True, location="block.data")
        fd = os.open(Path(tmp) / "block.data", os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold, like layout 1
        os.close(fd)
        started = time.perf_counter()
        session2 = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        load_init = time.perf_counter() - started
        run_init = _median_run(session2, outputs, feed, runs)

    mb = spec.nbytes / 1e6
    print(f"block {key}: {mb:.0f} MB of weights, batch 2, median of {runs} runs")
    print(f"{'layout':<34}{'load s':>9}{'run s':>9}")
    print(f"{'weights as inputs (edge)':<34}{load_inputs:>9.3f}{run_inputs:>9.3f}")
    print(f"{'initializers, external data':<34}{load_init:>9.3f}{run_init:>9.3f}")


def _median_run(session, outputs, feed, runs: int) -> float:
    session.run(outputs, feed)  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(outputs, feed)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]), args[1] if len(args) > 1 else "transformer/pair_0",
         int(args[2]) if len(args) > 2 else 5)
