"""The time each runtime takes to draw a seed's initial latents (edge/core/noise.py: torch.randn
for manual_seed(seed)) against torch.randn itself, side by side in one run: Wan2.1-T2V-1.3B's
latents at 480x832x81 (16x21x60x104 values) by default.

    python benchmarks/noise.py                       # torch, NumPy, JavaScript, Swift
    python benchmarks/noise.py --no-swift --rounds 5

Every runtime draws the same values; each is timed warm (best and median of --repeat calls
per round), rounds alternating torch, NumPy, chromium (runtimes/web/noise.js, served locally:
"javascript" is what a page runs, its WebAssembly SIMD kernel; "javascript_scalar" a second
page where WebAssembly.validate refuses the module, as a browser without SIMD does, so
noise.js falls back to its scalar JavaScript), Swift (the `edge-noise` executable, release
build) so load on the machine falls on all alike.
Prints one JSON object: per runtime the best and median seconds, their ratio to torch's, and
the sum of the values (the same draw everywhere, to about 1e-6 per value).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

# test infrastructure: how the tests start chromium (tests/chromium_launch.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chromium_launch import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SWIFT_PACKAGE = REPO   # Package.swift at the root; the sources in runtimes/swift
JS_TIMING = """async ([count, seed, repeat]) => {
  const { torchRandn } = await import('/noise.js');
  const times = [];
  let values;
  for (let i = 0; i < repeat; i++) {
    const start = performance.now();
    values = torchRandn(count, BigInt(seed));
    times.push((performance.now() - start) / 1000);
  }
  let sum = 0;
  for (const v of values) sum += v;
  return { times, sum };
}"""


def timed(draw, repeat: int) -> tuple[list[float], float]:
    times, values = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        values = draw()
        times.append(time.perf_counter() - start)
    return times, float(np.asarray(values, np.float64).sum())


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # stdout carries the report alone, stderr stays quiet
        pass


def serve_runtime() -> ThreadingHTTPServer:
    handler = functools.partial(QuietHandler, directory=str(REPO / "runtimes" / "web"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def swift_build(scratch: Path) -> Path:
    subprocess.run(["swift", "build", "-c", "release", "--product", "edge-noise",
                    "--scratch-path", str(scratch)], cwd=SWIFT_PACKAGE, check=True,
                   stdout=sys.stderr)  # stdout carries the report alone
    out = subprocess.run(["swift", "build", "-c", "release", "--show-bin-path",
                          "--scratch-path", str(scratch)], cwd=SWIFT_PACKAGE, check=True,
                         capture_output=True, text=True).stdout.strip()
    return Path(out) / "edge-noise"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="16,21,60,104")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10, help="warm calls per round")
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--no-js", action="store_true")
    parser.add_argument("--no-swift", action="store_true")
    parser.add_argument("--swift-scratch", type=Path, default=Path("/tmp/swift-build-bench"))
    args = parser.parse_args()

    import torch

    from edge.core.noise import torch_randn

    shape = tuple(int(d) for d in args.shape.split(","))
    count = math.prod(shape)
    torch.set_num_threads(1)  # torch draws normals on one thread anyway; keep it honest
    runs: dict[str, list[float]] = {"torch": [], "numpy": []}
    sums: dict[str, float] = {}
    def draw_torch():
        return torch.randn(shape, generator=torch.Generator().manual_seed(args.seed)).numpy()

    draw_numpy = functools.partial(torch_randn, shape, args.seed)
    pages = {}
    browser = playwright = server = None
    if not args.no_js:
        from playwright.sync_api import sync_playwright

        server = serve_runtime()
        playwright = sync_playwright().start()
        browser = playwright.chromium.launch(executable_path=args.chromium,
                                             args=CHROMIUM_ARGS)
        for name, init in (("javascript", None),
                           ("javascript_scalar", "WebAssembly.validate = () => false;")):
            context = browser.new_context()
            if init:
                context.add_init_script(init)
            pages[name] = context.new_page()
            pages[name].goto(f"http://127.0.0.1:{server.server_port}/")
            runs[name] = []
    swift = None if args.no_swift else swift_build(args.swift_scratch)
    if swift is not None:
        runs["swift"] = []
    for _ in range(args.rounds):
        for name, draw in (("torch", draw_torch), ("numpy", draw_numpy)):
            times, sums[name] = timed(draw, args.repeat)
            runs[name] += times
        for name, page in pages.items():
            result = page.evaluate(JS_TIMING, [count, str(args.seed), args.repeat])
            runs[name] += result["times"]
            sums[name] = result["sum"]
        if swift is not None:
            line = subprocess.run([str(swift), "--seed", str(args.seed), "--shape", args.shape,
                                   "--repeat", str(args.repeat)], check=True,
                                  capture_output=True, text=True).stdout.strip().splitlines()[-1]
            result = json.loads(line)
            runs["swift"].append(result["best_s"])  # the executable reports its best
            sums["swift"] = result["sum"]
    if browser is not None:
        browser.close()
        playwright.stop()
        server.shutdown()
    best_torch, median_torch = min(runs["torch"]), statistics.median(runs["torch"])
    report = {"shape": list(shape), "count": count, "seed": args.seed,
              "rounds": args.rounds, "repeat": args.repeat, "runtimes": {}}
    for name, times in runs.items():
        best, median = min(times), statistics.median(times)
        report["runtimes"][name] = {
            "best_ms": round(best * 1e3, 2), "median_ms": round(median * 1e3, 2),
            "best_vs_torch": round(best / best_torch, 2),
            "median_vs_torch": None if name == "swift" else round(median / median_torch, 2),
            "sum": round(sums[name], 3)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
