"""The web target's kernels (TVM WGSL replayed by runtimes/web/executor.js) against
onnxruntime-web's WebGPU and wasm providers, on tiny-sora's transformer blocks, side by side
in one headless chromium.

    python benchmarks/web_blocks.py --ort-dist ../shared/vendor/onnxruntime-web-1.30

Our executor first makes the page's kernel choice (PlanExecutor.tune). Two warm-up runs
are too few for the wasm provider (the browser optimises WebAssembly a few calls in; the
page's own timing, runtimes/web/paths.js timeBlock, runs calls for up to a second).
Each block is timed as a call a runtime makes: inputs on the CPU, weights already loaded
(our executor: GPU buffers; onnxruntime-web: the block exported with its weights as
initializers, so a session holds them), run, outputs read back to the CPU. Median of
`--runs` after `--warmup` runs. Prints one JSON object with milliseconds per block and
provider, and the ratios onnxruntime-web / ours (above 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

# test infrastructure: how the tests start chromium (tests/chromium_launch.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chromium_launch import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BLOCKS = ["transformer/prologue", "transformer/pair_0", "transformer/epilogue"]

PAGE = """<!doctype html><meta charset="utf-8"><title>bench</title>
<script type="module">
import * as ort from './ort/ort.all.min.mjs';
import { PlanExecutor } from './runtime/executor.js';
window.ort = ort; window.PlanExecutor = PlanExecutor; window.ready = true;
</script>"""

BENCH = """async ({blocks, runs, warmup}) => {
  const ort = window.ort;
  ort.env.wasm.wasmPaths = location.origin + '/ort/';
  ort.env.wasm.numThreads = navigator.hardwareConcurrency;
  const get = async (p) => (await fetch(p)).arrayBuffer();
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; };
  const time = async (fn) => {
    for (let i = 0; i < warmup; i++) await fn();
    const t = [];
    for (let i = 0; i < runs; i++) {
      const t0 = performance.now();
      await fn();
      t.push(performance.now() - t0);
    }
    return median(t);
  };
  const ex = await PlanExecutor.create(await navigator.gpu.requestAdapter());
  const out = {};
  for (const b of blocks) {
    const meta = b.meta;
    const inputs = {};
    for (const s of meta.inputs) {
      const buf = await get(`${b.dir}/in_${s.name}.bin`);
      inputs[s.name] = s.dtype === 'int32' ? new Int32Array(buf) : new Float32Array(buf);
    }
    // ours
    const plan = JSON.parse(new TextDecoder().decode(await get(`${b.dir}/plan.json`)));
    const prepared = await ex.prepare(plan, b.key);
    const blob = await get(`${b.dir}/weights.bin`);
    const weights = {};
    for (const t of meta.tensors) {
      weights[t.name] = ex.upload(new Uint8Array(blob, t.offset, t.bytes));
    }
    // the kernel choice the page makes at first load (PlanExecutor.tune), before timing
    const tuneInputs = {};
    for (const [n, a] of Object.entries(inputs)) tuneInputs[n] = ex.upload(a);
    await ex.tune(prepared, tuneInputs, weights);
    for (const g of Object.values(tuneInputs)) g.destroy();
    const ours = async () => {
      const given = {};
      for (const [n, a] of Object.entries(inputs)) given[n] = ex.upload(a);
      const res = ex.run(prepared, given, weights);
      for (let i = 0; i < res.length; i++) await ex.read(res[i], meta.output_bytes[i]);
      for (const g of Object.values(given)) g.destroy();
      for (const r of res) r.destroy();
    };
    const row = { ours_webgpu_ms: await time(ours), kernel_choices: { ...ex.tuned } };
    // onnxruntime-web
    const graph = new Uint8Array(await get(`${b.dir}/block.onnx`));
    for (const ep of ['webgpu', 'wasm']) {
      const session = await ort.InferenceSession.create(graph, { executionProviders: [ep] });
      const feeds = {};
      for (const s of meta.inputs) {
        const dtype = s.dtype === 'int32' ? 'int32' : 'float32';
        feeds[s.name] = new ort.Tensor(dtype, inputs[s.name], s.shape);
      }
      row[`ort_${ep}_ms`] = await time(async () => { await session.run(feeds); });
      await session.release();
    }
    out[b.key] = row;
  }
  return out;
}"""


def write_block(block, compiler, folder: Path) -> dict:
    """Plan, weights, an ONNX graph with the weights as initializers, and inputs."""
    from edge.exporters.onnx.package import write_weights
    from edge.exporters.web.package import write_plan
    from edge.exporters.web.tvm_plan import web_example

    folder.mkdir(parents=True)
    write_plan(compiler.compile(block), folder / "plan.json")
    tensors = write_weights(folder / "weights.bin", block.parameters())
    example = web_example(block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(block.module, example, str(folder / "block.onnx"),
                          input_names=block.inputs,
                          output_names=[f"out:{n}" for n in block.outputs],
                          dynamo=True, external_data=False, verbose=False)
    for name, t in zip(block.inputs, example, strict=True):
        (folder / f"in_{name}.bin").write_bytes(np.ascontiguousarray(t.numpy()).tobytes())
    outputs = block.run(*block.example)
    signature = [{"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                 for n, t in zip(block.inputs, example, strict=True)]
    return {"inputs": signature,
            "tensors": tensors, "output_bytes": [o.numel() * 4 for o in outputs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ort-dist", type=Path, required=True,
                        help="onnxruntime-web's dist folder (from npm)")
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if not (args.ort_dist / "ort.all.min.mjs").exists():
        raise SystemExit(f"{args.ort_dist}: no ort.all.min.mjs; give onnxruntime-web's dist folder")

    from playwright.sync_api import sync_playwright

    from edge.core.serve import make_server
    from edge.exporters.web.package import web_blocks
    from edge.exporters.web.tvm_plan import BlockCompiler
    from edge.families import load_model

    blocks = {b.key: b for bs in web_blocks(load_model()).values() for b in bs}
    compiler = BlockCompiler()
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp)
        shutil.copytree(args.ort_dist, site / "ort")
        shutil.copytree(REPO / "runtimes" / "web", site / "runtime")
        (site / "index.html").write_text(PAGE)
        specs = []
        for i, key in enumerate(BLOCKS):
            meta = write_block(blocks[key], compiler, site / f"b{i}")
            specs.append({"key": key, "dir": f"b{i}", "meta": meta})
        server = make_server(site, port=0, quiet=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(server.url.rstrip("/") + "/index.html")
            page.wait_for_function("window.ready === true")
            adapter = page.evaluate("async () => { const a = await navigator.gpu.requestAdapter();"
                                    " return a.info.vendor + ' ' + a.info.architecture; }")
            result = page.evaluate(BENCH, {"blocks": specs, "runs": args.runs,
                                           "warmup": args.warmup})
            browser.close()
        server.shutdown()
    for row in result.values():
        row["ort_webgpu_vs_ours"] = row["ort_webgpu_ms"] / row["ours_webgpu_ms"]
        row["ort_wasm_vs_ours"] = row["ort_wasm_ms"] / row["ours_webgpu_ms"]
    print(json.dumps({"adapter": adapter, "runs": args.runs, "blocks": result}, indent=1))


if __name__ == "__main__":
    main()
