"""A web package generating in headless Chromium under a memory budget, beside the Python
runtime on the very same package (its wasm graphs, runtimes/python/web_package.py) at the
same budget, in one run: wall time per generation, bytes read from storage and time waiting
for them, and peak memory: the browser's as the sum of PSS over every Chromium process
(sampled every 0.1 s), the Python process's peak RSS.

    edge export --model WAN_DIR --target web --height 32 --width 32 --frames 1 \\
        --bundle-ort ../shared/vendor/onnxruntime-web-1.30 -o /tmp/w16/pkg-fp16
    python benchmarks/web_streaming.py /tmp/w16/pkg-fp16 --budget-share 0.25 --path wasm

The budget is `--budget` (bytes, "700MB"), or `--budget-share` of the package's stored
transformer bytes (the issue's 25%). Reads are cold on both sides: the Python loader reads
with the page cache bypassed (`cold_reads`), and the browser, which reads the Cache API's
files through the page cache, has them evicted every 0.1 s (posix_fadvise DONTNEED over its
profile folder) while it runs. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chromium_launch import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from process_memory import reset_peak_rss, status_bytes  # noqa: E402

PROMPT = "a red circle moving left"
SAMPLE_S = 0.1

LOAD = """async ([budget, path]) => {
  const { Pipeline } = await import('/runtime/pipeline.js');
  const t0 = performance.now();
  window.pipe = await Pipeline.load(new URL('/', location.href).href, { budget, path });
  return { load_s: (performance.now() - t0) / 1000, figures: window.pipe.loadFigures,
           path: window.pipe.path }; }"""

# every WebAssembly memory the page makes (onnxruntime-web's heap), kept so its size can be
# read after each call: a wasm heap only grows, so its size after a generation is its peak
WATCH_WASM_MEMORY = """(() => {
  const Native = WebAssembly.Memory;
  window.wasmMemories = [];
  WebAssembly.Memory = function Memory(descriptor) {
    const memory = new Native(descriptor);
    window.wasmMemories.push(memory);
    return memory;
  };
  WebAssembly.Memory.prototype = Native.prototype;
})()"""

WASM_HEAP_BYTES = "() => window.wasmMemories.reduce((n, m) => n + m.buffer.byteLength, 0)"

GENERATE = """async ([prompt, seed, steps]) => {
  const t0 = performance.now();
  await window.pipe.generate(prompt, { seed, steps });
  return { wall_s: (performance.now() - t0) / 1000, run: window.pipe.lastRun }; }"""


def parents() -> dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:  # "pid (comm) state ppid ...": comm may hold spaces, so split after ")"
                out[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def process_kind(pid: int) -> str:
    """A Chromium process's kind from its command line: "browser", "renderer",
    "gpu-process", "utility:NetworkService", ... (Chromium rewrites its processes' titles, so
    the arguments are split on spaces as well as NULs)."""
    words = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().split()
    kind = next((w.split("=", 1)[1] for w in words if w.startswith("--type=")), "browser")
    sub = next((w.split("=", 1)[1] for w in words if w.startswith("--utility-sub-type=")), "")
    return f"{kind}:{sub.rsplit('.', 1)[-1]}" if sub else kind


def chromium_pss_bytes() -> dict[str, int]:
    """PSS (each shared page split among its sharers) by process kind over every Chromium
    process this one started (through Playwright's driver): summed, what the browser holds,
    counting shared memory once."""
    tree, me, kinds = parents(), os.getpid(), {}
    for pid in tree:
        up = pid
        while up in tree and up != me and up > 1:
            up = tree[up]
        if up != me or pid == me:
            continue
        try:
            if "chrom" not in os.path.basename(os.readlink(f"/proc/{pid}/exe")):
                continue
            kind = process_kind(pid)
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    kinds[kind] = kinds.get(kind, 0) + int(line.split()[1]) * 1024
        except OSError:  # gone
            continue
    return kinds


class Sampler:
    """Samples the browser's PSS, and evicts its profile folder from the page cache, on a
    thread every SAMPLE_S; `peak()` since the last `reset()`, and `peak_kinds()`, the PSS by
    process kind at that peak."""

    def __init__(self, profile: Path | None) -> None:
        self.profile = profile
        self._peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            kinds = chromium_pss_bytes()
            if sum(kinds.values()) > self.peak():
                self._peak = kinds
            if self.profile is not None:
                evict(self.profile)

    def reset(self) -> None:
        self._peak = {}

    def peak(self) -> int:
        return sum(self._peak.values())

    def peak_kinds(self) -> dict[str, int]:
        return dict(self._peak)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def evict(folder: Path) -> None:
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        except OSError:
            continue


def budget_bytes(manifest: dict, args) -> int:
    from edge.core.budget import parse_size

    if args.budget is not None:
        return parse_size(args.budget)
    transformer = next(c for c in manifest["components"] if c["name"] == "transformer")
    stored = sum(t["bytes"] for b in transformer["blocks"] for t in b["weights"]["tensors"])
    return int(stored * args.budget_share)


def python_side(package: Path, budget: int, steps: int, rounds: int) -> dict:
    from edge.runtimes.python import Pipeline
    from edge.runtimes.python.web_package import wasm_graph_opener

    pipe = Pipeline.load(package, memory_budget=budget, cold_reads=True,
                         open_block=wasm_graph_opener(package))
    runs = []
    try:
        for seed in range(rounds):
            reset_peak_rss()
            started = time.perf_counter()
            pipe.generate(PROMPT, seed=seed, steps=steps)
            runs.append({"wall_s": time.perf_counter() - started,
                         "peak_rss_bytes": status_bytes("VmHWM"), "run": pipe.last_run})
    finally:
        pipe.close()
    return {"runs": runs}


def browser_side(package: Path, budget: int, path: str | None, steps: int, rounds: int,
                 binary: str) -> dict:
    from playwright.sync_api import sync_playwright

    from edge.core.serve import make_server

    server = make_server(package, port=0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    profile = Path(tempfile.mkdtemp(prefix="edge-chromium-"))
    sampler = Sampler(profile)
    out: dict = {}
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                str(profile), executable_path=binary, args=CHROMIUM_ARGS, headless=True)
            page = context.new_page()
            page.add_init_script(WATCH_WASM_MEMORY)
            page.goto(server.url.rstrip("/") + "/manifest.json")
            time.sleep(1)
            out["idle_pss_by_process"] = chromium_pss_bytes()
            loaded = page.evaluate(LOAD, [budget, path])
            out["load"] = loaded | {"peak_pss_bytes": sampler.peak(),
                                    "peak_pss_by_process": sampler.peak_kinds(),
                                    "wasm_heap_bytes": page.evaluate(WASM_HEAP_BYTES)}
            runs = []
            for seed in range(rounds):
                sampler.reset()
                got = page.evaluate(GENERATE, [PROMPT, seed, steps])
                runs.append(got | {"peak_pss_bytes": sampler.peak(),
                                   "peak_pss_by_process": sampler.peak_kinds(),
                                   "wasm_heap_bytes": page.evaluate(WASM_HEAP_BYTES)})
                print(json.dumps({"page": runs[-1]["wall_s"],
                                  "weights": got["run"]["weights"]}), flush=True)
            out["runs"] = runs
            context.close()
    finally:
        sampler.stop()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path, help="a web package (edge export --target web)")
    parser.add_argument("--budget", default=None, help='bytes, e.g. "700MB"')
    parser.add_argument("--budget-share", type=float, default=0.25,
                        help="the budget as this share of the stored transformer's bytes")
    parser.add_argument("--path", choices=["webgpu", "wasm"], default="wasm")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--chromium", default=CHROMIUM)
    args = parser.parse_args()

    from edge.core.package import read_package

    manifest = read_package(args.package)
    budget = budget_bytes(manifest, args)
    package_bytes = sum(p.stat().st_size for p in args.package.rglob("*") if p.is_file())
    python = python_side(args.package, budget, args.steps, args.rounds)
    browser = browser_side(args.package, budget, args.path, args.steps, args.rounds,
                           args.chromium)
    page_s = [r["wall_s"] for r in browser["runs"]]
    py_s = [r["wall_s"] for r in python["runs"]]
    print(json.dumps({
        "package": str(args.package), "stored_as": manifest["web"]["storage"]["quantize"],
        "package_bytes": package_bytes, "budget_bytes": budget, "path": args.path,
        "steps": args.steps, "browser": browser, "python": python,
        "page_over_python": [a / b for a, b in zip(page_s, py_s, strict=True)],
        "browser_peak_pss_over_budget_bytes": max(r["peak_pss_bytes"] for r in browser["runs"])
        - budget}, indent=1, default=str))


if __name__ == "__main__":
    main()
