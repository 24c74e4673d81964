"""Does a concurrent cold read slow onnxruntime compute? One transformer pair of a package runs
alternately alone and while a background thread streams the other pairs' files with O_DIRECT
into recycled buffers (as the loader does); medians of each are printed.

    python benchmarks/read_interference.py PACKAGE [ROUNDS] [THREADS]
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge.runtimes.python.loader import BlockWeights, BufferPool, read_file, tensors_from


def weights_of(root: Path, block: dict) -> BlockWeights:
    return BlockWeights.of_block(block["name"], root / block["weights"]["path"], block)


def main() -> None:
    root = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    manifest = json.loads((root / "manifest.json").read_text())
    blocks = next(c for c in manifest["components"] if c["name"] == "transformer")["blocks"]
    pair, others = blocks[1], [weights_of(root, b) for b in blocks[2:-1]]
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = False
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(root / pair["graph"]), options,
                                   providers=["CPUExecutionProvider"])
    pool = BufferPool(None)
    spec = weights_of(root, pair)
    buf = pool.acquire(spec.nbytes)
    read_file(spec.path, spec.nbytes, True, into=buf)
    rng = np.random.default_rng(0)
    feeds = {s["name"]: rng.standard_normal([2 if d == "batch" else d for d in s["shape"]])
             .astype(s["dtype"]) for s in pair["inputs"]} | tensors_from(buf, spec)
    stop, read = threading.Event(), [0, 0.0]

    def reader() -> None:
        buffers = [pool.acquire(o.nbytes) for o in others[:2]]
        i = 0
        while not stop.is_set():
            o, started = others[i % len(others)], time.perf_counter()
            read_file(o.path, o.nbytes, True, into=buffers[i % 2])
            read[0] += o.nbytes
            read[1] += time.perf_counter() - started
            i += 1

    session.run(None, feeds)
    walls: dict[str, list[float]] = {"alone": [], "reading": []}
    for _ in range(rounds):
        for mode in walls:
            thread = None
            if mode == "reading":
                stop.clear()
                thread = threading.Thread(target=reader)
                thread.start()
            started = time.perf_counter()
            for _ in range(3):
                session.run(None, feeds)
            walls[mode].append((time.perf_counter() - started) / 3)
            if thread:
                stop.set()
                thread.join()
    print(json.dumps({mode: {"median_s": statistics.median(v), "runs_s": v}
                      for mode, v in walls.items()}
                     | {"read_bytes_per_s_while_computing": read[0] / read[1]}))


if __name__ == "__main__":
    main()
