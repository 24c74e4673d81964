"""The demo page's video against the Python runtime's, on one machine, side by side in one
run: the page in Debian's headless chromium (here WebGPU is SwiftShader, a software adapter,
so the page times both of its paths and picks one), the Python runtime on the ONNX package,
the same prompt and step count, generations alternating (python, page, python, ...) so load
on the machine falls on both alike.

    python benchmarks/web_page.py --ort-dist ../shared/vendor/onnxruntime-web-1.30
    python benchmarks/web_page.py --ort-dist DIR --path webgpu --rounds 1   # the GPU path alone
    python benchmarks/web_page.py --ort-dist DIR --model WAN_DIR --height 64 --width 96 \
        --frames 17 --path wasm                                         # a diffusers folder

Exports the model (tiny-sora, or --model's folder at --height/--width/--frames) to ONNX and
to a web package with onnxruntime-web bundled (into --work) when they are missing. Prints one
JSON object: per round the wall seconds of each and their ratio, the medians, and what the
page chose and why.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

# test infrastructure: how the tests start chromium (tests/chromium_launch.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chromium_launch import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PROMPT = "a red circle moving left"


def packages(work: Path, ort_dist: Path, folder: Path | None, size: dict) -> tuple[Path, Path]:
    from edge.exporters.onnx.package import export_onnx
    from edge.exporters.web.package import export_web
    from edge.families import load_model

    name = "tiny-sora" if folder is None else "-".join(
        [folder.name, *(str(v) for v in size.values() if v is not None)])
    onnx, web = work / f"{name}-onnx", work / f"{name}-web"
    if not (onnx / "manifest.json").exists() or not (web / "manifest.json").exists():
        model = load_model(folder, **size)
        if not (onnx / "manifest.json").exists():
            export_onnx(model, onnx)
        if not (web / "manifest.json").exists():
            export_web(model, web, bundle_ort=ort_dist)
    return onnx, web


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ort-dist", type=Path, required=True,
                        help="onnxruntime-web 1.30's dist folder (bundled into the package)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/edge-web-page"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--path", choices=["webgpu", "wasm"], default=None,
                        help="run this path instead of the page's choice")
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--model", type=Path, default=None,
                        help="a diffusers pipeline folder (default: tiny-sora)")
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--frames", type=int, default=None)
    args = parser.parse_args()
    size = {"height": args.height, "width": args.width, "frames": args.frames}
    if args.model is None and any(v is not None for v in size.values()):
        parser.error("--height, --width and --frames go with --model (tiny-sora's size is its own)")

    from playwright.sync_api import sync_playwright

    from edge.core.serve import make_server
    from edge.runtimes.python.pipeline import Pipeline

    onnx, web = packages(args.work, args.ort_dist, args.model,
                         size if args.model is not None else {})
    python = Pipeline.load(onnx)
    python.generate(PROMPT, seed=0, steps=1)  # sessions warm, as the page's are after load
    server = make_server(web, port=0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    query = f"?path={args.path}" if args.path else ""
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        page = browser.new_page()
        started = time.perf_counter()
        page.goto(server.url.rstrip("/") + "/index.html" + query)
        page.wait_for_function("window.edgeDemo && window.edgeDemo.ready !== undefined",
                               timeout=600_000)
        if not page.evaluate("window.edgeDemo.ready"):
            raise SystemExit(f"the page did not load: {page.evaluate('window.edgeDemo.error')}")
        load_s = time.perf_counter() - started
        chosen = page.evaluate("window.edgeDemo.pipe.path")
        expected = page.inner_text("#expected")
        page.fill("#steps", str(args.steps))
        page.fill("#prompt", PROMPT)
        for i in range(args.rounds):
            python.generate(PROMPT, seed=i, steps=args.steps)
            py_s = python.last_run["wall_s"]["total"]
            page.fill("#seed", str(i))
            run = page.evaluate("window.edgeDemo.generate()")
            page_s = run["wall_s"]["total"]
            rows.append({"python_s": py_s, "page_s": page_s, "ratio": page_s / py_s,
                         "page_transformer_s": run["wall_s"]["transformer"]})
            print(json.dumps(rows[-1]), flush=True)
        browser.close()
    server.shutdown()
    print(json.dumps({
        "model": web.name, "steps": args.steps, "page_load_s": load_s, "page_path": chosen,
        "page_expected": expected, "rounds": rows,
        "median_python_s": statistics.median(r["python_s"] for r in rows),
        "median_page_s": statistics.median(r["page_s"] for r in rows),
        "median_ratio": statistics.median(r["ratio"] for r in rows)}, indent=1))


if __name__ == "__main__":
    main()
