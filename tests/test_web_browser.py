"""The web target in a real browser: Debian's chromium, driven by Playwright (never a browser of
its own), with a WebGPU adapter (SwiftShader on machines without a GPU). tiny-sora is
exported with `--target web` once per module and served with `edge serve`'s server.

Skips, with the reason, where this machine has no chromium or chromium gives no WebGPU
adapter; CI installs chromium (.ci/run)."""

from __future__ import annotations

import copy
import json
import re
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")
playwright_api = pytest.importorskip("playwright.sync_api",
                                     reason="playwright (test extra) is not installed")

from browser import (  # noqa: E402  (after the skips)
    ORT_DIST,
    PAGE_READY_MS,
    assert_same_video,
    b64,
    from_b64,
    serving,
    skip_without_webgpu,
)
from conftest import WEB_SMALL_SHARDS  # noqa: E402

from edge.core.budget import format_size  # noqa: E402
from edge.core.serve import PackageRequestHandler, PackageServer  # noqa: E402
from edge.core.video_metrics import psnr  # noqa: E402
from edge.exporters.web.storage import DEFAULT_FORM  # noqa: E402

pytestmark = pytest.mark.slow  # headless Chromium: tens of seconds per page

FIXTURES = Path(__file__).parent / "fixtures" / "sampler"
NOISE_FIXTURE = Path(__file__).parent / "fixtures" / "noise" / "torch_randn.json"
NOISE_TOLERANCE = 1e-5  # torch's SIMD float32 log/sin/cos; measured 2.4e-7 (both of noise.js's
                        # paths; over whole draws 4.8e-7, one float32 ulp at |value| >= 4)
STEPS = 2             # a short generation keeps SwiftShader's share of the suite small


def model_records(manifest: dict) -> list[dict]:
    """The files the page fetches (runtimes/web/pipeline.js), in its order, once each."""
    out = [*manifest["tokenizer"]["files"], *manifest["conditioning"].values()]
    out += [f for c in manifest["components"] for b in c["blocks"] for f in b["files"]]
    return list({f["path"]: f for f in out}.values())


@pytest.fixture(scope="module")
def web_package(tiny_sora_web):
    """conftest.py's tiny-sora web package (shared with tests/test_web_api.py)."""
    return tiny_sora_web


def skip_without_ort(manifest: dict) -> None:
    if not manifest["web"]["ort"]["bundled"]:
        pytest.skip(f"no onnxruntime-web 1.30 dist at {ORT_DIST} (set EDGE_ORT_WEB_DIST): the "
                    "wasm path's browser tests serve a local copy and never reach the CDN")


def test_web_package_verifies_like_every_package(web_package):
    """Same manifest format: read_package checks every file (plans, weight shards, runtime,
    page) by size and sha256; shards stay under the limit; the site files are listed."""
    from edge.core.manifest_schema import PackageError, check_manifest
    from edge.core.package import read_package

    root, _ = web_package
    manifest = read_package(root)
    assert manifest["target"] == "web"
    assert manifest["web"]["shard_bytes"] == WEB_SMALL_SHARDS
    shards = [root / p for c in manifest["components"] for b in c["blocks"]
              for p in b["weights"]["shards"]]
    assert all(p.stat().st_size <= WEB_SMALL_SHARDS for p in shards)
    assert len(shards) > sum(len(c["blocks"]) for c in manifest["components"])  # one split
    listed = {f["path"] for f in manifest["files"]}
    assert {"index.html", "app.js", "runtime/pipeline.js", "runtime/executor.js",
            "runtime/ort_executor.js", "runtime/paths.js",
            "runtime/vendor/tokenizers.mjs"} <= listed
    if manifest["web"]["ort"]["bundled"]:
        assert {"ort/ort.wasm.min.mjs", "ort/ort-wasm-simd-threaded.wasm", "ort/LICENSE"} <= listed
    # every block has its wasm path's graph among its files (verified like the rest)
    for c in manifest["components"]:
        for b in c["blocks"]:
            assert b["wasm"]["graph"] in {f["path"] for f in b["files"]}
            assert b["wasm"]["graph"].endswith(".onnx")
    broken = copy.deepcopy(manifest)
    broken["components"][1]["blocks"][1]["wasm"]["graph"] = "graphs/elsewhere.onnx"
    del broken["manifest_sha256"]  # the structure check, not the digest, is what is tested
    with pytest.raises(PackageError, match="wasm graph 'graphs/elsewhere.onnx' is not one of"):
        check_manifest(broken)


@pytest.fixture(scope="module")
def served(web_package):
    with serving(web_package[0]) as url:
        yield url


@pytest.fixture(scope="module")
def page(browser, served):
    """The demo page, loaded once (kernels compile once: SwiftShader takes ~30 s), with a GPU
    budget under the model's weights: the transformer stays on the GPU, the text encoder and
    the VAE decoder are uploaded at each use."""
    context = browser.new_context()
    pg = context.new_page()
    pg.goto(served + "manifest.json")
    skip_without_webgpu(context, pg)
    pg.goto(served + "index.html?budget=64MB&path=webgpu")
    pg.wait_for_function("window.edgeDemo && window.edgeDemo.ready !== undefined",
                         timeout=PAGE_READY_MS)
    assert pg.evaluate("window.edgeDemo.ready"), pg.evaluate("window.edgeDemo.error")
    yield pg
    context.close()


# one block of the loaded package, run alone by the page's executor on given inputs; weights
# uploaded here (not through the page's budgeted loader, whose counts a later test checks)
RUN_BLOCK = """async ({key, inputs}) => {
  const pipe = window.edgeDemo.pipe, ex = pipe.executor, block = pipe.blocks.get(key);
  const bytes = await pipe.weights.source.get(key);
  const weights = await ex.uploadWeights(bytes, block.record.weights.tensors, key);
  pipe.weights.source.done(key);
  const given = {};
  for (const [n, text] of Object.entries(inputs)) {
    given[n] = ex.upload(Uint8Array.from(atob(text), c => c.charCodeAt(0)));
  }
  const outs = ex.run(block.prepared, given, weights);
  await ex.device.queue.onSubmittedWorkDone();
  const result = [];
  for (let i = 0; i < outs.length; i++) {
    const n = block.record.outputs[i].shape.reduce((a, b) => a * b, 1) * 4;
    const buf = new Uint8Array(await ex.read(outs[i], n));
    let text = '';
    for (let j = 0; j < buf.length; j += 8192) {
      text += String.fromCharCode(...buf.subarray(j, j + 8192));
    }
    result.push(btoa(text));
  }
  for (const b of [...outs, ...Object.values(given), ...Object.values(weights)]) b.destroy();
  return result;
}"""


FORCE_CHOICE = """([key, pick]) => {
  const ex = window.edgeDemo.pipe.executor, saved = new Map(ex.choices);
  for (const c of window.edgeDemo.pipe.blocks.get(key).prepared.calls) {
    if (c.key) ex.choices.set(c.key, pick);
  }
  window.savedChoices = saved;
}"""


def pair_case(tiny_sora, form: str = DEFAULT_FORM):
    """A transformer pair, its example inputs (base64, as RUN_BLOCK takes them) and PyTorch's
    outputs on them with the weights as the package stores them (`form`), decoded."""
    from edge.exporters.web.package import web_blocks
    from edge.exporters.web.storage import run_decoded, stored_weights
    from edge.exporters.web.tvm_plan import web_example

    block = web_blocks(tiny_sora)["transformer"][1]
    inputs = {n: b64(t.numpy()) for n, t in zip(block.inputs, web_example(block), strict=True)}
    return block, inputs, [t.numpy() for t in run_decoded(block, stored_weights(block, form))]


def test_transformer_pair_on_webgpu_matches_pytorch(page, tiny_sora):
    """One block alone on its example inputs (the end-to-end test below runs them all), with
    each of the exporter's kernel schedules (TVM's tiled matmul and the alternative)."""
    block, inputs, want = pair_case(tiny_sora)
    for pick in (0, 1):
        page.evaluate(FORCE_CHOICE, [block.key, pick])
        try:
            got = page.evaluate(RUN_BLOCK, {"key": block.key, "inputs": inputs})
        finally:
            page.evaluate("() => { window.edgeDemo.pipe.executor.choices = window.savedChoices; }")
        for text, w in zip(got, want, strict=True):
            g = from_b64(text, np.float32, w.shape)
            assert np.abs(g - w).max() < 1e-4, (block.key, pick)


RUN_PLAN = """async ({plan, kernels, inputs}) => {
  const ex = window.edgeDemo.pipe.executor;
  const prepared = await ex.prepare({ plan, kernels }, 'one key');
  const given = {};
  for (const [n, text] of Object.entries(inputs)) {
    given[n] = ex.upload(Uint8Array.from(atob(text), c => c.charCodeAt(0)));
  }
  const [out] = ex.run(prepared, given, {});
  const bytes = plan.values[plan.results[0]].shape.reduce((a, b) => a * b, 1) * 4;
  const buf = new Uint8Array(await ex.read(out, bytes));
  for (const b of [out, ...Object.values(given)]) b.destroy();
  return btoa(String.fromCharCode(...buf));
}"""


def test_kernels_that_keep_values_between_them_run_on_webgpu(page):
    """Attention over one key (Wan at 16 x 16 x 1 is one token): no dlight rule fuses its
    softmax, whose row maxima and sums then stay in global memory from one kernel to the next.
    The plan gives them scratch buffers (item 32: the export failed validation after minutes),
    and the page's WebGPU executor runs the block as PyTorch does."""
    import torch

    from edge.exporters.web.tvm_plan import BlockCompiler
    from edge.graph.blocks import Block

    class OneKey(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2) * 4.0, dim=-1) @ v

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (4, 1, 1))
    block = Block("transformer", "block_0", OneKey(), ["q", "k", "v"], ["y"], (q, k, v))
    compiled = BlockCompiler().compile(block)
    softmax = [c for c in compiled.plan.calls if "softmax" in c["func"]]
    assert softmax and all(len(c.get("scratch", [])) == 2 for c in softmax)
    bound = {i for c in softmax for kernel in c["kernels"] for i in kernel["bindings"]}
    assert {len(softmax[0]["args"]), len(softmax[0]["args"]) + 1} <= bound
    got = page.evaluate(RUN_PLAN, {
        "plan": compiled.plan.to_json(), "kernels": compiled.wgsl,
        "inputs": {n: b64(t.numpy()) for n, t in zip(block.inputs, (q, k, v), strict=True)}})
    want = block.run(q, k, v)[0].numpy()
    assert np.abs(from_b64(got, np.float32, want.shape) - want).max() < 1e-5


def test_kernel_choice_is_timed_once_per_adapter_and_remembered(page):
    """At first load the page timed the alternative schedules of the transformer's matmuls
    (pairs share kernels, so once for all) and stored the choice for this adapter."""
    figures = page.evaluate("window.edgeDemo.pipe.loadFigures.kernel_choices")
    assert figures["timed"] > 0 and figures["remembered"] == figures["timed"]
    again = page.evaluate("""async () => {
      const { PlanExecutor } = await import('/runtime/executor.js');
      const ex = window.edgeDemo.pipe.executor;
      const fresh = new PlanExecutor(ex.device, ex.adapterKey);
      const other = new PlanExecutor(ex.device, 'another adapter');
      return [fresh.choices.size, [...fresh.choices].every(([k, v]) => ex.choices.get(k) === v),
              other.choices.size];
    }""")
    assert again == [figures["remembered"], True, 0]


def test_sampler_fixtures_replay_in_the_browser(page):
    """The JS sampler reaches the decisions and numbers recorded from edge/core/sampler.py."""
    fixtures = {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))}
    got = page.evaluate("""async (fixtures) => {
      const s = await import('/runtime/sampler.js');
      const out = {};
      for (const [name, f] of Object.entries(fixtures)) {
        if (f.indicators) {
          const cache = new s.StepCache(f.threshold);
          out[name] = f.indicators.map((ind, i) => {
            const a = Float64Array.from(ind.flat(Infinity));
            const r = cache.shouldCompute(a, i === 0 || i === f.indicators.length - 1);
            if (r) cache.store(new Float32Array(a.length), new Float32Array(a.length).fill(1));
            return r;
          });
          continue;
        }
        const vel = f.velocities.map(v => Float32Array.from(v.flat(Infinity)));
        const unc = (f.uncond_velocities ?? f.velocities)
          .map(v => Float32Array.from(v.flat(Infinity)));
        const trace = {}, times = [], guided = [];
        const predict = async (x, t, step) => {
          times.push(t);
          guided.push(step.guided);
          return [vel[step.index], step.guided ? unc[step.index] : null];
        };
        const x = await s.sample(predict,
          Float32Array.from(f.noise.flat(Infinity)), s.checkSettings(f.settings), null, trace);
        out[name] = { calls: trace.calls, leap_at: trace.leap_at, cosines: trace.cosines,
                      times, guided, guided_calls: trace.guided_calls, latent: [...x] };
      }
      return out;
    }""", fixtures)
    for name, f in fixtures.items():
        expected = f["expected"]
        if "indicators" in f:
            assert got[name] == expected["computed"], name
            continue
        assert got[name]["calls"] == expected["calls"], name
        assert got[name]["leap_at"] == expected["leap_at"], name
        if "guided" in expected:  # the guidance fixtures: which calls ran the null half
            assert got[name]["guided"] == expected["guided"], name
            assert got[name]["guided_calls"] == expected["guided_calls"], name
        np.testing.assert_allclose(got[name]["cosines"], expected["cosines"], rtol=0, atol=1e-12)
        assert np.array_equal(np.float32(got[name]["times"]), np.float32(expected["times"])), name
        assert np.array_equal(np.float32(got[name]["latent"]),
                              np.float32(expected["latent"]).ravel()), name


def test_sampler_timesteps_match_python_bit_for_bit(page):
    from edge.core.sampler import SamplerSettings, timesteps

    for steps, shift in [(30, 3.0), (6, 3.0), (1, 1.0), (7, 2.5)]:
        want = timesteps(SamplerSettings(steps=steps, shift=shift))
        got = page.evaluate("""async ([steps, shift]) => {
          const s = await import('/runtime/sampler.js');
          return [...s.timesteps(s.checkSettings({steps, shift}))];
        }""", [steps, shift])
        assert np.array_equal(np.float32(got), want), (steps, shift)


@pytest.fixture(scope="module")
def runtime_page(browser, served):
    """A page of the served package that loads no model: for the runtime's modules alone."""
    context = browser.new_context()
    pg = context.new_page()
    pg.goto(served + "manifest.json")
    yield pg
    context.close()


# Which way noise.js drew: it validates its WebAssembly SIMD module once (on the first draw of 16
# values or more) and falls back to its scalar JavaScript where validate says no; the
# "javascript" page makes validate say no, as a browser without SIMD does.
NOISE_PATHS = {
    "wasm-simd": """{ const validate = WebAssembly.validate; window.noiseValidated = [];
      WebAssembly.validate = (b) => { const ok = validate.call(WebAssembly, b);
                                      window.noiseValidated.push(ok); return ok; }; }""",
    "javascript": """{ window.noiseValidated = [];
      WebAssembly.validate = () => { window.noiseValidated.push(false); return false; }; }""",
}


@pytest.fixture(scope="module", params=sorted(NOISE_PATHS))
def noise_page(request, browser, served):
    """A runtime page per way noise.js draws (NOISE_PATHS): (path, page)."""
    context = browser.new_context()
    context.add_init_script(NOISE_PATHS[request.param])
    pg = context.new_page()
    pg.goto(served + "manifest.json")
    yield request.param, pg
    context.close()


# each fixture case drawn by torchRandn: the worst difference from torch's values, the float64
# sum of all values, and whether a Number seed (where exact) draws the same as the string
REPLAY_NOISE = """async (cases) => {
  const { torchRandn } = await import('/runtime/noise.js');
  return cases.map((c) => {
    const got = torchRandn(c.count, c.seed);
    const index = c.values ? null : c.samples.index, want = c.values || c.samples.value;
    let worst = 0, sum = 0;
    want.forEach((v, i) => { worst = Math.max(worst, Math.abs(got[index ? index[i] : i] - v)); });
    for (let i = 0; i < got.length; i++) sum += got[i];
    let asNumber = null;
    if (BigInt(c.seed) <= BigInt(Number.MAX_SAFE_INTEGER) && c.count < 5000) {
      const other = torchRandn(c.count, Number(c.seed));
      asNumber = other.every((v, i) => Object.is(v, got[i]));
    }
    return { length: got.length, worst, sum, asNumber, finite: got.every(Number.isFinite) };
  });
}"""


def test_seed_noise_replays_what_torch_draws(noise_page):
    """runtimes/web/noise.js draws, for every case of tests/fixtures/noise/torch_randn.json
    (written from torch itself: under 16 values, whole and partial groups of 16, seeds past
    2^32, 2^53 and up to 2^63 - 1, Wan's 16x21x60x104 latents), torch.randn's values: with its
    WebAssembly SIMD kernel and with the JavaScript it falls back to. Also a count that takes
    several of the kernel's chunks, ends inside a twist and redraws a partial group, against
    the NumPy reference (edge/core/noise.py)."""
    from edge.core.noise import torch_randn

    path, pg = noise_page
    cases = json.loads(NOISE_FIXTURE.read_text())["cases"]
    got = pg.evaluate(REPLAY_NOISE, cases)
    for case, g in zip(cases, got, strict=True):
        name = f"{path}: seed {case['seed']}, {case['count']} values"
        assert g["length"] == case["count"] and g["finite"], name
        assert g["worst"] < NOISE_TOLERANCE, f"{name}: {g['worst']:.2g}"
        assert g["asNumber"] in (None, True), name
        if "sum" in case:
            assert abs(g["sum"] - case["sum"]) <= 1e-3 * abs(case["sum"]), name
    assert any(g["asNumber"] for g in got)
    assert any("sum" in c and c["count"] == 16 * 21 * 60 * 104 for c in cases)  # Wan's
    # 3 chunks of 16 twists, 5 twists, 3 groups of the next and 7 values past them
    count = 3 * 16 * 624 + 5 * 624 + 3 * 16 + 7
    drawn = pg.evaluate(f"""async () => {{
      const {{ torchRandn }} = await import('/runtime/noise.js');
      return Array.from(torchRandn({count}, 11n)); }}""")
    assert np.abs(np.float32(drawn) - torch_randn((count,), 11)).max() < NOISE_TOLERANCE
    # the page drew the way it was meant to: the module validated once, kept or refused
    assert pg.evaluate("window.noiseValidated") == [path == "wasm-simd"]


def test_consecutive_draws_of_one_seed_are_torchs(noise_page):
    """torchRandnDraws: the draws one torch generator gives in turn (LTX-Video's decode noise
    after the initial latents): the second starts mid-twist and, for a count not a multiple
    of 16, after a redrawn partial group; against torch.randn itself."""
    import torch

    path, pg = noise_page
    for counts in ([128 * 3 * 2 * 4, 128 * 3 * 2 * 4], [1000 + 5, 624 * 2 + 37, 9]):
        g = torch.Generator().manual_seed(21)
        want = [torch.randn(c, generator=g).numpy() for c in counts]
        got = pg.evaluate(f"""async () => {{
          const {{ torchRandnDraws }} = await import('/runtime/noise.js');
          return torchRandnDraws({counts}, 21).map((a) => Array.from(a)); }}""")
        for w, d in zip(want, got, strict=True):
            assert np.abs(np.float32(d) - w).max() < NOISE_TOLERANCE, (path, counts)
    refused = pg.evaluate("""async () => {
      const { torchRandnDraws } = await import('/runtime/noise.js');
      try { torchRandnDraws([9, 100], 1); return null; } catch (e) { return e.message; } }""")
    assert refused == "noise draws [9,100]: only the last may hold under 16 values"


def test_seed_checks_refuse_what_is_not_a_seed(runtime_page):
    """checkSeed takes a whole Number up to 2^53 - 1, a BigInt or a decimal string up to
    2^63 - 1 and names what it refuses; 2^63 - 1 as a string and as a BigInt draw the
    fixture's values for it; only the low 32 bits count, as in torch (2^32 + 7 draws 7's)."""
    from edge.core.noise import torch_randn

    out = runtime_page.evaluate("""async () => {
      const { checkSeed, torchRandn } = await import('/runtime/noise.js');
      const refused = {};
      for (const [name, seed] of [["negative", -1], ["fraction", 1.5], ["NaN", NaN],
          ["2^63", 2n ** 63n], ["unsafe", 2 ** 60], ["negative BigInt", -1n], ["text", "12a"],
          ["boolean", true]]) {
        try { refused[name] = `accepted: ${checkSeed(seed)}`; }
        catch (err) { refused[name] = err.message; }
      }
      const same = (a, b) => a.length === b.length && a.every((v, i) => Object.is(v, b[i]));
      const max = torchRandn(33, "9223372036854775807");
      return { refused,
        accepted: [checkSeed("9223372036854775807"), checkSeed(2n ** 63n - 1n),
                   checkSeed(Number.MAX_SAFE_INTEGER), checkSeed(0)].map(String),
        max: [...max], maxSame: same(max, torchRandn(33, 2n ** 63n - 1n)),
        low32: [...torchRandn(100, 2n ** 32n + 7n)],
        low32Same: same(torchRandn(100, 2n ** 32n + 7n), torchRandn(100, 7)) };
    }""")
    r = out["refused"]
    assert r["negative"] == "seed -1 is out of range: a seed is a whole number from 0 to 2^63 - 1"
    assert r["negative BigInt"] == r["negative"]
    assert r["fraction"] == "seed 1.5 must be a whole number from 0 to 2^63 - 1"
    assert r["NaN"] == "seed NaN must be a whole number from 0 to 2^63 - 1"
    assert r["2^63"] == ("seed 9223372036854775808 is out of range: a seed is a whole number "
                         "from 0 to 2^63 - 1")
    assert r["unsafe"].startswith("seed 1152921504606847000 is past 2^53 - 1")
    assert "as a BigInt or a string of its decimal digits" in r["unsafe"]
    assert r["text"] == 'seed "12a" must be a whole number from 0 to 2^63 - 1, in decimal digits'
    assert r["boolean"].startswith("seed true (boolean) must be a whole number")
    assert out["accepted"] == [str(2**63 - 1), str(2**63 - 1), str(2**53 - 1), "0"]
    fixture = {(c["seed"], c["count"]): c for c in json.loads(NOISE_FIXTURE.read_text())["cases"]}
    want_max = fixture[str(2**63 - 1), 33]["values"]
    assert out["maxSame"] and np.abs(np.float32(out["max"]) - want_max).max() < NOISE_TOLERANCE
    assert out["low32Same"]
    assert np.abs(np.float32(out["low32"]) - fixture[str(2**32 + 7), 100]["values"]).max() \
        < NOISE_TOLERANCE
    assert np.abs(np.float32(out["low32"]) - torch_randn((100,), 7)).max() < NOISE_TOLERANCE


def test_loader_takes_the_noise_field_as_an_optional_string(runtime_page, web_package):
    """The manifest's `noise` (what a seed means): absent in older packages, a string where
    written; anything else is refused at load, naming the field."""
    manifest = web_package[1]
    assert manifest["noise"] == "torch.randn/cpu/float32"
    out = runtime_page.evaluate("""async (manifest) => {
      const { checkManifest } = await import('/runtime/manifest.js');
      const out = {};
      for (const [name, noise] of [["written", manifest.noise], ["absent", undefined],
          ["other", "numpy.pcg64"], ["number", 7], ["null", null], ["list", ["a"]]]) {
        const m = { ...manifest };
        if (noise === undefined) delete m.noise; else m.noise = noise;
        try { checkManifest(m, 'manifest.json'); out[name] = null; }
        catch (err) { out[name] = err.message; }
      }
      return out;
    }""", manifest)
    assert out["written"] is None and out["absent"] is None and out["other"] is None
    for name, shown in [("number", "7"), ("null", "null"), ("list", '["a"]')]:
        assert out[name] == ("manifest.json: field 'noise' must be a string (the seeds' "
                             f'definition, e.g. "torch.randn/cpu/float32"), got {shown}')


def test_corrupt_shard_is_refetched_then_refused(page, web_package, served):
    """A cached shard that fails its sha256 is dropped and fetched again; a server copy that
    is damaged too gives an error naming the file."""
    _, manifest = web_package
    record = manifest["components"][2]["blocks"][0]["files"][1]
    script = """async (record) => {
      const { PackageFiles } = await import('/runtime/package_files.js');
      const files = await PackageFiles.open(location.origin + '/');
      const cache = await caches.open('edge-web-packages-v1');
      await cache.put(files.url(record.path), new Response(new Uint8Array(record.bytes)));
      try {
        const got = await files.fetchFile(record);
        return { ok: got.byteLength, refetched: files.refetched };
      } catch (err) { return { error: err.message }; }
    }"""
    out = page.evaluate(script, record)
    assert out == {"ok": record["bytes"], "refetched": [record["path"]]}
    # the server's copy damaged: answered by a route, so the shared package's file (which
    # other tests may be reading) is never changed
    damaged = served + record["path"]
    page.route(damaged, lambda route: route.fulfill(body=b"\0" * record["bytes"]))
    try:
        out = page.evaluate(script, record)
    finally:
        page.unroute(damaged)
    assert record["path"] in out["error"] and "also after fetching it again" in out["error"]


class CuttingHandler(PackageRequestHandler):
    """`edge serve`'s handler, except that a path in `server.cuts` ({path: [bytes, times]}) is
    answered `times` times with its full Content-Length but only its first `bytes` bytes,
    then the connection is closed: a download interrupted mid-body (such an answer ignores
    a Range header, as a server without ranges does). `server.ranges` records each GET's
    Range header by path."""

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.lstrip("/")
        with self.server.lock:
            self.server.gets[path] = self.server.gets.get(path, 0) + 1
            self.server.ranges.setdefault(path, []).append(self.headers.get("Range"))
            cut = self.server.cuts.get(path)
            if cut and cut[1] > 0:
                cut[1] -= 1
            else:
                cut = None
        if cut is None:
            super().do_GET()
            return
        data = (self.server.root / path).read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[:cut[0]])
        self.close_connection = True


@pytest.fixture(scope="module")
def cutting(web_package):
    """The package served by a server that cuts the downloads it is told to (CuttingHandler)."""
    server = PackageServer(web_package[0], port=0, quiet=True)
    server.RequestHandlerClass = CuttingHandler
    server.lock, server.gets, server.cuts, server.ranges = threading.Lock(), {}, {}, {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# every file of the package through the loader, as the page loads it (no kernels compiled)
FETCH_ALL = """async (records) => {
  const { PackageFiles } = await import('/runtime/package_files.js');
  const files = await PackageFiles.open(location.origin + '/');
  const progress = [];
  files.onProgress = (got, total) => progress.push([got, total]);
  const bytes = await files.fetchAll(records);
  return { sizes: Object.fromEntries([...bytes].map(([p, b]) => [p, b.byteLength])), progress,
           interrupted: files.interrupted, refetched: files.refetched, fromCache: files.fromCache };
}"""

# path -> [bytes, sha256] of each file the Cache API holds for this origin
CACHED = """async () => {
  const { sha256Hex } = await import('/runtime/manifest.js');
  const cache = await caches.open('edge-web-packages-v1'), out = {};
  for (const request of await cache.keys()) {
    const b = await (await cache.match(request)).arrayBuffer();
    out[new URL(request.url).pathname.slice(1)] = [b.byteLength, await sha256Hex(b)];
  }
  return out;
}"""

GOT = re.compile(r"got (\d+) of (\d+) bytes")


def test_interrupted_download_is_retried_and_never_cached(browser, cutting, web_package):
    """Three kinds of cut download, each once: the server closes the connection mid-body
    (full Content-Length, half the bytes), the connection is reset before any response
    (Playwright's route.abort), a response ends early (route.fulfill with a short body). The
    next attempt asks only for the missing bytes (Range) and the file arrives whole; the
    progress figure only grows (a retried file is never counted twice). A shard cut at every
    attempt (by a server that ignores Range: each attempt starts over) is refused after 3
    attempts naming the file and the bytes got, and is not in the cache; a reload then finds
    only whole files there and fetches the missing one."""
    root, manifest = web_package
    records = model_records(manifest)
    by_path = {r["path"]: r for r in records}
    shards = [r for r in records if r["path"].endswith(".bin")]
    severed, reset, short, always = (shards[1], shards[2], shards[3], shards[4])
    context = browser.new_context()
    pg = context.new_page()
    try:
        pg.goto(cutting.url + "manifest.json")
        cutting.cuts[severed["path"]] = [severed["bytes"] // 2, 1]
        tries = {"reset": 0, "short": 0}

        def reset_once(route):
            tries["reset"] += 1
            route.abort("connectionreset") if tries["reset"] == 1 else route.continue_()

        def short_once(route):
            tries["short"] += 1
            if tries["short"] > 1:
                route.continue_()
                return
            whole = route.fetch()
            route.fulfill(status=200, headers=whole.headers, body=whole.body()[:1000])

        pg.route("**/" + reset["path"], reset_once)
        pg.route("**/" + short["path"], short_once)
        out = pg.evaluate(FETCH_ALL, records)
        pg.unroute_all()

        assert out["sizes"] == {r["path"]: r["bytes"] for r in records}
        assert cutting.gets[severed["path"]] == 2 and tries == {"reset": 2, "short": 2}
        cut = {m.split(": ", 1)[0]: m for m in out["interrupted"]}
        assert len(out["interrupted"]) == 3 and set(cut) == {r["path"] for r in (severed, reset,
                                                                                  short)}
        got, of = map(int, GOT.search(cut[severed["path"]]).groups())
        assert 0 < got <= severed["bytes"] // 2 and of == severed["bytes"]
        assert "got 1000 of" in cut[short["path"]] and "got 0 of" in cut[reset["path"]]
        assert cutting.ranges[severed["path"]] == [None, f"bytes={got}-"]
        assert cutting.ranges[short["path"]] == [None, "bytes=1000-"]  # route.fetch, then retry
        assert cutting.ranges[reset["path"]] == [None]                 # aborted before sent
        total = sum(r["bytes"] for r in records)
        loaded = [g for g, t in out["progress"] if t == total]
        assert len(loaded) == len(out["progress"]) and loaded == sorted(loaded)
        assert loaded[-1] == total
        cached = pg.evaluate(CACHED)
        assert cached == {p: [r["bytes"], r["sha256"]] for p, r in by_path.items()}

        # cut at every attempt: refused, nothing of it stored
        pg.evaluate("async (u) => (await caches.open('edge-web-packages-v1')).delete(u)",
                    cutting.url + always["path"])
        cutting.cuts[always["path"]] = [always["bytes"] // 3, 99]
        before = cutting.gets[always["path"]]
        error = pg.evaluate("""async (record) => {
          const { PackageFiles } = await import('/runtime/package_files.js');
          const files = await PackageFiles.open(location.origin + '/');
          try { await files.fetchFile(record); return null; } catch (err) { return err.message; }
        }""", always)
        cutting.cuts.clear()
        assert error.startswith(always["path"] + ": the download was interrupted 3 times")
        assert len(GOT.findall(error)) == 3 and f"of {always['bytes']} bytes" in error
        assert cutting.gets[always["path"]] == before + 3
        # each retry asks for the rest; the server answers all of it, so the next starts over
        assert cutting.ranges[always["path"]][-2:] == [f"bytes={n}-" if int(n) else None
                                                       for n, _ in GOT.findall(error)[:2]]
        assert always["path"] not in pg.evaluate(CACHED)

        # the next visit: every cached file verifies, the missing one is fetched whole
        pg.reload()
        again = pg.evaluate(FETCH_ALL, records)
        assert again["sizes"] == out["sizes"]
        assert (again["fromCache"], again["refetched"], again["interrupted"]) == (
            len(records) - 1, [], [])
        assert cutting.gets[always["path"]] == before + 4
    finally:
        context.close()



def test_page_names_the_file_it_could_not_download(browser, cutting, web_package):
    """The demo page, when a shard is cut at every attempt, stops before compiling anything
    and shows the loader's error: the file, the attempts and the bytes got."""
    shard = next(r for r in model_records(web_package[1]) if r["path"].endswith(".bin"))
    context = browser.new_context()
    pg = context.new_page()
    try:
        pg.goto(cutting.url + "manifest.json")
        skip_without_webgpu(context, pg)
        cutting.cuts[shard["path"]] = [shard["bytes"] // 2, 99]
        pg.goto(cutting.url + "index.html?path=webgpu")
        pg.wait_for_function("window.edgeDemo && window.edgeDemo.ready !== undefined",
                             timeout=PAGE_READY_MS)
        assert pg.evaluate("window.edgeDemo.ready") is False
        assert pg.is_visible("#error")
        error = pg.inner_text("#error")
        assert error.startswith(shard["path"] + ": the download was interrupted 3 times")
        assert f"of {shard['bytes']} bytes" in error and "load the page again" in error
        assert pg.is_disabled("#generate")
    finally:
        cutting.cuts.clear()
        context.close()

QUOTA_BYTES = 40_000_000  # room for the text encoder's first shard, not for the whole package


def test_quota_exceeded_runs_from_memory_and_caches_nothing(browser, served, web_package,
                                                            tiny_sora):
    """A real storage quota: Chromium's DevTools `Storage.overrideQuotaForOrigin` sets this
    origin's quota under the package's size, so the Cache API refuses a shard with
    QuotaExceededError partway. The page says the model could not be stored, naming the
    file; the model runs from memory (a transformer pair matches PyTorch); the files stored
    before the refusal are dropped, so the cache holds nothing of the package."""
    root, manifest = web_package
    records = {r["path"]: r for r in model_records(manifest)}
    assert sum(r["bytes"] for r in records.values()) > QUOTA_BYTES
    context = browser.new_context()
    pg = context.new_page()
    try:
        pg.goto(served + "manifest.json")
        skip_without_webgpu(context, pg)
        cdp = context.new_cdp_session(pg)
        cdp.send("Storage.overrideQuotaForOrigin",
                 {"origin": served.rstrip("/"), "quotaSize": QUOTA_BYTES})
        pg.goto(served + "index.html?budget=64MB&path=webgpu")
        pg.wait_for_function("window.edgeDemo && window.edgeDemo.ready !== undefined",
                             timeout=PAGE_READY_MS)
        assert pg.evaluate("window.edgeDemo.ready"), pg.evaluate("window.edgeDemo.error")
        note = pg.inner_text("#notice")
        assert pg.is_visible("#notice") and pg.is_hidden("#error")
        stored = re.search(r"storage quota for this site is exceeded while storing (\S+)\)", note)
        assert stored and stored.group(1) in records, note
        assert "runs from memory" in note and "downloaded again on the next visit" in note
        assert pg.evaluate("window.edgeDemo.pipe.loadFigures.cache_failure") == note
        # files were stored before the refusal (the first shard fits the quota) and dropped
        assert list(records).index(stored.group(1)) > 0
        assert pg.evaluate(CACHED) == {}

        block, inputs, want = pair_case(tiny_sora)
        got = pg.evaluate(RUN_BLOCK, {"key": block.key, "inputs": inputs})
        for text, w in zip(got, want, strict=True):
            assert np.abs(from_b64(text, np.float32, w.shape) - w).max() < 1e-4
    finally:
        context.close()


@pytest.fixture(scope="module")
def python_video(exported_package):
    """The Python runtime's video (T, H, W, 3) for (prompt, seed, steps), each made once."""
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(exported_package[0])
    made: dict = {}

    def video(prompt: str, seed: int, steps: int) -> np.ndarray:
        if (prompt, seed, steps) not in made:
            made[prompt, seed, steps] = pipe.generate(prompt, seed=seed, steps=steps)[0]
        return made[prompt, seed, steps]

    yield video
    pipe.close()


# the demo page's last video, base64 (uint8 (T, H, W, 3))
LAST_FRAMES = """() => { const f = window.edgeDemo.lastFrames;
  let t = ''; for (let j = 0; j < f.frames.length; j += 8192)
    t += String.fromCharCode(...f.frames.subarray(j, j + 8192));
  return { data: btoa(t), shape: f.shape }; }"""

# generate() from the page, as the Generate button does: the run's figures, or the error
GENERATE = """async (noise) => { try { return await window.edgeDemo.generate(noise === null ? {} :
  { noise: new Float32Array(Uint8Array.from(atob(noise), c => c.charCodeAt(0)).buffer) }); }
  catch (err) { return { error: err.message }; } }"""

# counts the blocks the loaded pipeline runs from now on (window.blockRuns)
COUNT_RUNS = """() => { const ex = window.edgeDemo.pipe.executor;
  if (!ex.counted) { const run = ex.run.bind(ex);
    ex.run = (...args) => { window.blockRuns += 1; return run(...args); }; ex.counted = true; }
  window.blockRuns = 0; }"""


def last_frames(pg) -> np.ndarray:
    frames = pg.evaluate(LAST_FRAMES)
    return from_b64(frames["data"], np.uint8, frames["shape"])


def fill_form(pg, prompt: str, steps: int, seed: int) -> None:
    """The demo page's prompt, step count and seed fields, as a user types them."""
    for field, value in (("#prompt", prompt), ("#steps", str(steps)), ("#seed", str(seed))):
        pg.fill(field, value)


def generate_from_the_form(pg, prompt: str, steps: int, seed: int,
                           screenshot: Path) -> tuple[dict, np.ndarray]:
    """Fill the form, press Generate (no noise given: the field's seed is drawn), and return
    the run's figures and its frames; a screenshot of the page is saved."""
    fill_form(pg, prompt, steps, seed)
    run = pg.evaluate(GENERATE, None)
    assert "error" not in run, run
    frames = last_frames(pg)
    pg.screenshot(path=str(screenshot))
    return run, frames


def test_demo_page_generates_the_python_video(page, web_package, python_video, tmp_path):
    """The demo page's seed 3 is the Python runtime's seed 3 (both draw torch.randn's noise
    for it): the same video, on WebGPU with a GPU budget under the model's weights."""
    prompt, seed = "a red circle moving left", 3
    resident = set(page.evaluate("[...window.edgeDemo.pipe.weights.resident.keys()]"))
    run, got = generate_from_the_form(page, prompt, STEPS, seed, tmp_path / "demo.png")
    assert_same_video(got, python_video(prompt, seed, STEPS))
    assert run["transformer_calls"] == STEPS
    assert run["peak_gpu_weight_bytes"] <= 64 * 2**20
    manifest = web_package[1]
    pinned = set(page.evaluate("window.edgeDemo.pipe.loadFigures.pinned"))
    uses = {"text_encoder": 1, "transformer": STEPS,
            "vae_decoder": -(-manifest["latent_shape"][1] // manifest["web"]["vae_frames"])}
    keys = [(c["name"], f"{c['name']}/{b['name']}") for c in manifest["components"]
            for b in c["blocks"]]
    assert len(pinned) < len(keys)  # some blocks stream
    # pinned blocks are uploaded once (the transformer's already at load, for the kernel
    # timing), streamed blocks at every use
    assert run["weight_uploads"] == sum(uses[c] if k not in pinned else int(k not in resident)
                                        for c, k in keys)
    assert "transformer" in page.inner_text("#timings")
    assert (tmp_path / "demo.png").stat().st_size > 0
    # a block's bytes are free once on the GPU: streamed blocks go through one reused
    # buffer, each read (after the first) while the block before it runs
    weights = run["weights"]
    streamed = [sum(f["bytes"] for f in b["files"] if f["path"] in b["weights"]["shards"])
                for c in manifest["components"] for b in c["blocks"]
                if f"{c['name']}/{b['name']}" not in pinned]
    assert weights["streamed_reads"] > 0 and weights["slot_misses"] == 0
    assert weights["read_ahead"] >= weights["streamed_reads"] - 1
    assert weights["peak_streamed_bytes"] <= max(streamed)
    # blocks reach the GPU in pieces through one scratch buffer, a bounded number in flight
    upload = weights["upload"]
    assert upload["pieces"] > 0 and upload["scratch_bytes"] <= upload["chunk_bytes"]
    assert upload["peak_in_flight_bytes"] <= upload["in_flight_limit"]
    # every block's (and variant's) intermediates live in one shared set of buffers, the
    # largest each
    plans = [json.loads((web_package[0] / r["graph"]).read_text())["plan"]["storages"]
             for c in manifest["components"] for b in c["blocks"]
             for r in (b, *b.get("variants", {}).values())]
    shared = [max(p[i] for p in plans if i < len(p)) for i in range(max(map(len, plans)))]
    held = page.evaluate("window.edgeDemo.pipe.executor.figures().storage_bytes")
    assert held == sum(-(-n // 4) * 4 for n in shared) < sum(map(sum, plans))


UNGUIDED = """async (seed) => { const pipe = window.edgeDemo.pipe;
  const v = await pipe.generate('a red circle moving left', { seed, steps: 3, guidance_steps: 1 });
  let t = ''; for (let j = 0; j < v.frames.length; j += 8192)
    t += String.fromCharCode(...v.frames.subarray(j, j + 8192));
  return { data: btoa(t), shape: v.shape, batches: pipe.lastRun.transformer_batches }; }"""


def test_unguided_steps_run_the_caption_half_plans_on_webgpu(page, exported_package):
    """After a guidance cutoff the WebGPU path runs the transformer's `unguided` plans, a
    batch of one: the Python runtime's video of the same cutoff (ONNX, a batch of one)."""
    from edge.runtimes.python import Pipeline

    got = page.evaluate(UNGUIDED, 3)
    assert got["batches"] == [2, 1, 1]
    pipe = Pipeline.load(exported_package[0])
    try:
        want = pipe.generate("a red circle moving left", seed=3, steps=3, guidance_steps=1)[0]
        guided = pipe.generate("a red circle moving left", seed=3, steps=3)[0]
    finally:
        pipe.close()
    assert psnr(guided, want) < 40, "the cutoff changes nothing here"
    assert_same_video(from_b64(got["data"], np.uint8, got["shape"]), want)


def test_gpu_residency_follows_the_python_loader(page):
    """planPins (GPU budget) makes the Python loader's choices on the same sizes, and refuses
    a budget under the largest block naming it."""
    from edge.core.budget import plan_pins

    sizes = {"transformer/prologue": 300, "transformer/pair_0": 500, "transformer/pair_1": 500,
             "transformer/epilogue": 100, "vae_decoder/head": 700, "text_encoder/layer_0": 400}
    every = [k for k in sizes if k.startswith("transformer/")]
    for budget in [700, 1500, 2000, 2600, 4000, None]:
        got = page.evaluate("""async ([sizes, budget, every]) => {
          const { planPins } = await import('/runtime/loader.js');
          return [...planPins(sizes, budget, every)].sort(); }""", [sizes, budget, every])
        assert got == sorted(plan_pins(sizes, budget, tuple(every))), budget
    error = page.evaluate("""async (sizes) => {
      const { planPins } = await import('/runtime/loader.js');
      try { planPins(sizes, 600, []); return null; } catch (err) { return err.message; } }""",
                          sizes)
    assert "vae_decoder/head" in error and "700" in error


def test_bodies_are_read_through_one_reused_buffer(page):
    """eachChunk reads a byte stream (a Response's body) into a staging buffer it reuses,
    so a large file leaves no chunk buffers behind; a stream that is not bytes is read as it
    comes; onChunk returning false stops the read."""
    got = page.evaluate("""async () => {
      const { eachChunk } = await import('/runtime/bodies.js');
      const bytes = new Uint8Array(3_500_000).map((_, i) => (i * 7) % 251);
      const out = new Uint8Array(bytes.length);
      let at = 0;
      const sizes = new Set();
      const whole = await eachChunk(new Response(bytes).body, (c) => {
        out.set(c, at); at += c.byteLength; sizes.add(c.buffer.byteLength); return true; });
      const plain = new ReadableStream({ start(c) {
        c.enqueue(new Uint8Array([1, 2, 3])); c.enqueue(new Uint8Array([4])); c.close(); } });
      const items = [];
      const plainWhole = await eachChunk(plain, (c) => { items.push(...c); return true; });
      let calls = 0;
      const stopped = await eachChunk(new Response(bytes).body,
                                      () => { calls += 1; return false; });
      return { whole, same: at === bytes.length && out.every((v, i) => v === bytes[i]),
               staging: [...sizes], plainWhole, items, stopped, calls }; }""")
    assert got["whole"] and got["same"]
    assert got["staging"] == [1 << 20]  # every chunk was read into the 1 MiB staging buffer
    assert got["plainWhole"] and got["items"] == [1, 2, 3, 4]
    assert got["stopped"] is False and got["calls"] == 1


def test_a_blocks_shards_are_read_into_their_places_in_one_buffer(browser, served, web_package):
    """fetchAll's placeOf: a pinned block's shards go straight into one buffer (no shard
    buffers joined and left to the collector), from the network on a first visit and from the
    Cache API on the next, each shard's bytes checked in place."""
    _, manifest = web_package
    block = next(b for c in manifest["components"] for b in c["blocks"]
                 if len(b["weights"]["shards"]) > 1)
    records = [next(f for f in block["files"] if f["path"] == p)
               for p in block["weights"]["shards"]]
    context = browser.new_context()
    pg = context.new_page()
    pg.goto(served + "manifest.json")
    placed = """async (records) => {
      const { PackageFiles } = await import('/runtime/package_files.js');
      const { sha256Hex } = await import('/runtime/manifest.js');
      const files = await PackageFiles.open(location.origin + '/');
      const joined = new ArrayBuffer(records.reduce((n, r) => n + r.bytes, 0));
      const places = new Map();
      let at = 0;
      for (const r of records) {
        places.set(r.path, new Uint8Array(joined, at, r.bytes));
        at += r.bytes;
      }
      const got = await files.fetchAll(records, () => true, (r) => places.get(r.path));
      const inPlace = records.every((r) => got.get(r.path) === places.get(r.path));
      const digests = [];
      for (const r of records) digests.push(await sha256Hex(places.get(r.path)));
      return { inPlace, digests, fromCache: files.fromCache }; }"""
    try:
        for visit, from_cache in (("first", 0), ("second", len(records))):
            got = pg.evaluate(placed, records)
            assert got["inPlace"], visit
            assert got["digests"] == [r["sha256"] for r in records], visit
            assert got["fromCache"] == from_cache, visit
    finally:
        context.close()


LOAD_UNDER_BUDGET = """async (budget) => {
  const { Pipeline } = await import('/runtime/pipeline.js');
  try { (await Pipeline.load(new URL('/', location.href).href, { path: 'webgpu', budget }))
    .destroy(); return null; }
  catch (err) { return err.message; } }"""


def webgpu_load_error(browser, served, budget, init_script=None, manifest=None):
    """`Pipeline.load` on the WebGPU path in a fresh context (with `init_script`, and
    `manifest` served instead of the package's): its error message and the paths requested."""
    context = browser.new_context()
    if init_script:
        context.add_init_script(init_script)
    if manifest is not None:
        context.route("**/manifest.json", lambda route: route.fulfill(
            body=json.dumps(manifest), content_type="application/json"))
    pg = context.new_page()
    pg.goto(served + "manifest.json")
    skip_without_webgpu(context, pg)
    requested = []
    pg.on("request", lambda r: requested.append(urlsplit(r.url).path.lstrip("/")))
    try:
        return pg.evaluate(LOAD_UNDER_BUDGET, budget), requested
    finally:
        context.close()


def test_a_budget_under_the_largest_block_is_refused_before_the_download(browser, served,
                                                                         web_package):
    """The GPU sizes come from the manifest (float32 once decoded), so the page refuses the
    budget naming the block and the figures before it fetches any weights (the path asked
    for: no block is fetched to time the paths)."""
    from edge.exporters.web.storage import SCALE_SUFFIX

    _, manifest = web_package
    sizes = {f"{c['name']}/{b['name']}": 4 * sum(int(np.prod(t["shape"]))
                                                 for t in b["weights"]["tensors"]
                                                 if not t["name"].endswith(SCALE_SUFFIX))
             for c in manifest["components"] for b in c["blocks"]}
    largest = max(sizes, key=sizes.get)
    error, requested = webgpu_load_error(browser, served, "1MB")
    assert error == (f"GPU memory budget {2**20} bytes is smaller than block {largest} "
                     f"({sizes[largest]} bytes); the smallest budget that works is "
                     f"{sizes[largest]} bytes"), error
    assert "manifest.json" in requested
    assert not [p for p in requested if p.startswith(("weights/", "plans/"))], requested


# an adapter that binds at most `limit` bytes of a storage buffer (the adapter's and the
# device's limits read through the same prototype)
SMALL_BINDING = """Object.defineProperty(GPUSupportedLimits.prototype,
  'maxStorageBufferBindingSize', { get() { return %d; } });"""


def shard_of(block: dict, offset: int) -> str:
    """The weights file of a block that byte `offset` of its weights lies in."""
    sizes = {f["path"]: f["bytes"] for f in block["files"]}
    ends = np.cumsum([sizes[p] for p in block["weights"]["shards"]])
    return block["weights"]["shards"][int(np.searchsorted(ends, offset, side="right"))]


def first_past_binding(manifest: dict, limit: int) -> str:
    """What the page refuses first where a binding may take at most `limit` bytes, in its
    order (blocks in order; each block's weights, then its plan's largest binding)."""
    from edge.exporters.web.storage import SCALE_SUFFIX

    for c in manifest["components"]:
        for b in c["blocks"]:
            key = f"{c['name']}/{b['name']}"
            for t in b["weights"]["tensors"]:
                n = 4 * int(np.prod(t["shape"]))
                if not t["name"].endswith(SCALE_SUFFIX) and n > limit:
                    shape = ",".join(map(str, t["shape"]))
                    return (f"block {key}: weight {t['name']} [{shape}] (in "
                            f"{shard_of(b, t['offset'])}, decoded to float32) takes {n} bytes")
            if b["gpu"]["largest_binding"] > limit:
                return (f"block {key}: the largest tensor a kernel of its launch plan "
                        f"({b['graph']}) binds takes {b['gpu']['largest_binding']} bytes")
    raise AssertionError(f"nothing past {limit} bytes")


@pytest.mark.parametrize("past", ["weight", "plan"])
def test_an_adapter_that_cannot_bind_a_block_is_refused_before_the_download(
        browser, served, web_package, past):
    """An adapter whose maxStorageBufferBindingSize is under a weight (float32 on the GPU) or
    under the largest tensor a block's plan binds (the manifest's `gpu`) is refused from the
    manifest alone, naming the block, the tensor or plan file, the figure and the limit."""
    from edge.exporters.web.storage import SCALE_SUFFIX

    manifest = copy.deepcopy(web_package[1])
    blocks = [b for c in manifest["components"] for b in c["blocks"]]
    weight = max(4 * int(np.prod(t["shape"])) for b in blocks for t in b["weights"]["tensors"]
                 if not t["name"].endswith(SCALE_SUFFIX))
    assert max(b["gpu"]["largest_binding"] for b in blocks) == weight  # bound whole
    limit = weight - 4 if past == "weight" else weight
    if past == "plan":  # tiny-sora's activations are smaller than its weights: say larger
        manifest["components"][-1]["blocks"][-1]["gpu"]["largest_binding"] = weight + 4
    error, requested = webgpu_load_error(browser, served, None, SMALL_BINDING % limit, manifest)
    assert error == (f"{first_past_binding(manifest, limit)} on the GPU, past this adapter's "
                     f"maxStorageBufferBindingSize of {limit} bytes; the WebGPU path cannot "
                     "run this package here (the wasm path can: ?path=wasm)"), error
    assert not [p for p in requested if p.startswith(("weights/", "plans/"))], requested


NO_WEBGPU = "delete Navigator.prototype.gpu;"
WASM_STEPS = 8
READY = "window.edgeDemo && window.edgeDemo.ready !== undefined"


def rewritten_manifest(route, change) -> None:
    """Answer a manifest.json request with the package's manifest changed by `change`."""
    manifest = json.loads(route.fetch().text())
    change(manifest)
    route.fulfill(body=json.dumps(manifest), content_type="application/json")


def page_without_webgpu(browser):
    """A page, in a browser context of its own, whose browser has no WebGPU; and the list of
    the paths it requests (growing as it loads)."""
    context = browser.new_context()
    context.add_init_script(NO_WEBGPU)
    pg = context.new_page()
    requested = []
    pg.on("request", lambda r: requested.append(urlsplit(r.url).path.lstrip("/")))
    return context, pg, requested


@pytest.fixture(scope="module")
def wasm_page(browser, served, web_package):
    """The demo page in a browser without WebGPU (the wasm path), loaded once; and the paths
    it requested while loading."""
    skip_without_ort(web_package[1])
    context, pg, requested = page_without_webgpu(browser)
    pg.goto(served + "index.html")
    pg.wait_for_function(READY, timeout=PAGE_READY_MS)
    assert pg.evaluate("window.edgeDemo.ready"), pg.evaluate("window.edgeDemo.error")
    yield pg, list(requested)
    context.close()


def test_page_without_webgpu_generates_through_wasm(wasm_page, python_video, tmp_path):
    """No WebGPU in the browser: the page says it runs on the CPU through onnxruntime-web and
    why, shows the expected time before Generate, fetches the wasm graphs and no WebGPU plan,
    and a seed past 2^53 typed in the seed field gives the Python runtime's video for it."""
    pg, requested = wasm_page
    where, expected = pg.inner_text("#path"), pg.inner_text("#expected")
    assert "onnxruntime-web" in where and "no WebGPU" in where, where
    assert re.match(r"Expected: about [\d.]+ s of denoising for \d+ steps", expected)
    assert pg.is_hidden("#gpu-missing") and pg.is_hidden("#error")
    assert pg.evaluate("window.edgeDemo.pipe.path.name") == "wasm"
    assert not any(p.startswith("plans/") for p in requested)
    assert any(p.startswith("graphs/") for p in requested)
    assert "ort/ort-wasm-simd-threaded.wasm" in requested
    # edge serve makes the page cross-origin isolated: onnxruntime-web gets one thread a core
    # up to 8 unless ?threads= says otherwise
    cores = pg.evaluate("crossOriginIsolated ? Math.min(navigator.hardwareConcurrency, 8) : 1")
    assert pg.evaluate("window.edgeDemo.pipe.loadFigures.threads") == cores

    prompt, seed = "the blue box slides up", 2**63 - 1  # exact only as text or BigInt in JS
    run, got = generate_from_the_form(pg, prompt, WASM_STEPS, seed, tmp_path / "wasm.png")
    assert_same_video(got, python_video(prompt, seed, WASM_STEPS))
    assert run["transformer_calls"] == WASM_STEPS


def test_page_refuses_a_thread_count_it_cannot_give(browser, served, web_package):
    """?threads= that is not a whole number from 1 to 64 stops the load before the package is
    downloaded, naming the option and the value given."""
    skip_without_ort(web_package[1])
    context, pg, requested = page_without_webgpu(browser)
    try:
        for given, shown in (("0", "0"), ("two", "NaN"), ("65", "65")):
            requested.clear()
            pg.goto(served + f"index.html?threads={given}")
            pg.wait_for_function(READY, timeout=PAGE_READY_MS)
            assert not pg.evaluate("window.edgeDemo.ready")
            error = pg.inner_text("#error")
            assert "threads must be a whole number from 1 to 64" in error, error
            assert f"got {shown}" in error, error
            assert not any(p.startswith(("graphs/", "weights/", "ort/")) for p in requested)
    finally:
        context.close()


WASM_BUDGET = 32 << 20  # tiny-sora at fp16: the transformer and a few decoder blocks kept
SAME_GRAPHS_PSNR_DB = 55.0  # onnxruntime-web and onnxruntime on the same graphs (measured:
                            # the same frames, byte for byte)


def test_wasm_path_streams_blocks_from_storage_under_a_page_memory_budget(
        browser, served, web_package, python_video, tmp_path):
    """With a budget on the wasm path the page keeps the blocks the Python loader would pin
    (the transformer first) and reads the others back from the browser's storage at each
    use, checked, the next one while the current one runs: the same video, the weights held
    never past the budget, each streamed block read once per use, no weights file fetched
    from the network after the download; the page says what it holds and streams."""
    _, manifest = web_package
    skip_without_ort(manifest)
    sizes = {f"{c['name']}/{b['name']}": sum(t["bytes"] for t in b["weights"]["tensors"])
             for c in manifest["components"] for b in c["blocks"]}
    context, pg, requested = page_without_webgpu(browser)
    try:
        # one thread, as a page beside other busy tabs or programs would ask (item 33)
        pg.goto(served + f"index.html?budget={WASM_BUDGET >> 20}MB&threads=1")
        pg.wait_for_function(READY, timeout=PAGE_READY_MS)
        assert pg.evaluate("window.edgeDemo.ready"), pg.evaluate("window.edgeDemo.error")
        assert pg.evaluate("window.edgeDemo.pipe.loadFigures.threads") == 1
        pinned = set(pg.evaluate("window.edgeDemo.pipe.loadFigures.pinned"))
        kept = set(pg.evaluate("[...window.edgeDemo.pipe.weights.source.kept.keys()]"))
        where = pg.inner_text("#path")
        loaded = len(requested)
        prompt, seed = "a red circle moving left", 3
        run, got = generate_from_the_form(pg, prompt, STEPS, seed, tmp_path / "streamed.png")
        shown = pg.inner_text("#timings")
    finally:
        context.close()
    assert kept == pinned and {k for k in sizes if k.startswith("transformer/")} <= pinned
    streamed = [k for k in sizes if k not in pinned]
    assert streamed and all(k.startswith(("text_encoder/", "vae_decoder/")) for k in streamed)
    assert_same_video(got, python_video(prompt, seed, STEPS))
    # the Python runtime on this very package (its wasm graphs, the weights streamed by its
    # loader under the same budget, split files read back to back): the page's video
    from edge.runtimes.python import Pipeline
    from edge.runtimes.python.web_package import wasm_graph_opener

    root = web_package[0]
    python = Pipeline.load(root, memory_budget=WASM_BUDGET, open_block=wasm_graph_opener(root))
    try:
        same = python.generate(prompt, seed=seed, steps=STEPS)[0]
    finally:
        python.close()
    print(f"page against the Python runtime on the package: PSNR {psnr(got, same):.1f} dB")
    assert psnr(got, same) >= SAME_GRAPHS_PSNR_DB
    weights = run["weights"]
    assert weights["held_in"] == "page memory" and weights["stored_as"] == "fp16"
    assert weights["budget"] == WASM_BUDGET
    assert 0 < weights["peak_held_bytes"] <= WASM_BUDGET
    uses = {"text_encoder": 1,
            "vae_decoder": -(-manifest["latent_shape"][1] // manifest["web"]["vae_frames"])}
    files = {f"{c['name']}/{b['name']}": sum(f["bytes"] for f in b["files"]
                                             if f["path"] in b["weights"]["shards"])
             for c in manifest["components"] for b in c["blocks"]}  # read whole, padding too
    assert weights["streamed_bytes"] == sum(files[k] * uses[k.split("/")[0]] for k in streamed)
    assert weights["streamed_reads"] == sum(uses[k.split("/")[0]] for k in streamed)
    assert weights["peak_streamed_bytes"] <= sum(sorted(files[k] for k in streamed)[-2:])
    # every streamed read after the first is read ahead, into one of the two reused buffers
    assert weights["read_ahead"] >= weights["streamed_reads"] - 1 and weights["slot_misses"] == 0
    assert not [p for p in requested[loaded:] if p.startswith("weights/")]  # storage only
    assert "streamed from storage" in where and f"{format_size(WASM_BUDGET)} budget" in where
    assert "streamed" in shown and "fp16" in shown


def test_seed_is_refused_before_any_work_where_the_package_means_other_noise(
        wasm_page, python_video):
    """A package written before the manifest's `noise` field (its seeds meant NumPy PCG64
    noise), or one naming "numpy.pcg64": the page refuses a seed with the runtime's message
    and runs nothing; given the initial noise it runs (the Python runtime's video for that
    noise's seed). A bad seed in the field and a seed given with noise are refused too."""
    from edge.core.noise import LEGACY_NOISE, NOISE, torch_randn

    pg, _ = wasm_page
    prompt, seed, steps = "a red circle moving left", 3, 1
    fill_form(pg, prompt, steps, seed)
    pg.evaluate(COUNT_RUNS)
    assert pg.evaluate("window.edgeDemo.pipe.manifest.noise") == NOISE
    errors = {}
    try:
        for name, change in [("no field", "delete m.noise"),
                             ("pcg64", f"m.noise = '{LEGACY_NOISE}'")]:
            pg.evaluate(f"() => {{ const m = window.edgeDemo.pipe.manifest; {change}; }}")
            errors[name] = pg.evaluate(GENERATE, None).get("error")
            assert pg.is_visible("#error") and pg.inner_text("#error") == errors[name]
        noise = torch_randn((1, *pg.evaluate("window.edgeDemo.pipe.latentShape")), seed)
        assert "error" not in pg.evaluate(GENERATE, b64(noise))  # given noise: no seed drawn
        assert pg.evaluate("window.blockRuns") > 0
        given = last_frames(pg)
    finally:
        pg.evaluate(f"() => {{ window.edgeDemo.pipe.manifest.noise = '{NOISE}'; }}")
    for error in errors.values():
        assert error.endswith(f'manifest.json: noise "{LEGACY_NOISE}": this runtime draws a seed '
                              f'as "{NOISE}", so the seed would give another video than the '
                              "package's; re-export the package or pass the initial noise"), error
    assert_same_video(given, python_video(prompt, seed, steps))

    # refused before any work, whatever the package: a seed the runtime cannot take, and a
    # seed with noise (the page sends the field's seed only without noise: as a caller would)
    pg.evaluate(COUNT_RUNS)
    refused = {}
    for text in ["-1", "1.5", "abc", "", "9223372036854775808"]:
        pg.fill("#seed", text)
        refused[text] = pg.evaluate(GENERATE, None).get("error")
        assert pg.inner_text("#error") == refused[text]
    refused["with noise"] = pg.evaluate("""async (noise) => { try { await window.edgeDemo.pipe
        .generate('a red circle', { seed: 3, noise: new Float32Array(noise) }); }
        catch (err) { return err.message; } }""", [0.0] * noise.size)
    assert pg.evaluate("window.blockRuns") == 0
    assert refused == {
        "-1": "seed -1 is out of range: a seed is a whole number from 0 to 2^63 - 1",
        "1.5": 'seed "1.5" must be a whole number from 0 to 2^63 - 1, in decimal digits',
        "abc": 'seed "abc" must be a whole number from 0 to 2^63 - 1, in decimal digits',
        "": 'seed "" must be a whole number from 0 to 2^63 - 1, in decimal digits',
        "9223372036854775808": "seed 9223372036854775808 is out of range: a seed is a whole "
                               "number from 0 to 2^63 - 1",
        "with noise": "seed and noise given together: the noise is the initial latents, so "
                      "give one"}
    pg.fill("#seed", "0")


def test_software_adapter_times_both_paths_and_keeps_the_faster(browser, served, web_package):
    """On a software WebGPU adapter (SwiftShader here) the page times one transformer block
    on each path, runs the faster (wasm, by far, on SwiftShader), says why with both figures,
    and on the next visit reuses the choice without timing again."""
    skip_without_ort(web_package[1])
    context = browser.new_context()
    pg = context.new_page()
    try:
        pg.goto(served + "manifest.json")
        skip_without_webgpu(context, pg)
        adapter = pg.evaluate("""async () => { const { adapterLabel, isSoftwareAdapter } =
            await import('/runtime/paths.js'); const a = await navigator.gpu.requestAdapter();
            return [adapterLabel(a), isSoftwareAdapter(a)]; }""")
        if not adapter[1]:
            pytest.skip(f"{adapter[0]} is a hardware adapter: the page runs WebGPU untimed")
        pg.goto(served + "index.html")
        pg.wait_for_function(READY, timeout=PAGE_READY_MS)
        assert pg.evaluate("window.edgeDemo.ready"), pg.evaluate("window.edgeDemo.error")
        path = pg.evaluate("window.edgeDemo.pipe.path")
        t = path["timings"]
        assert t["block"] == "transformer/pair_0" and t["wasm_ms"] > 0 and t["webgpu_ms"] > 0
        assert path["name"] == ("wasm" if t["wasm_ms"] <= t["webgpu_ms"] else "webgpu")
        if "swiftshader" in adapter[0].lower():
            assert path["name"] == "wasm", t
        assert "timed now" in pg.inner_text("#path")
        assert f"{t['wasm_ms']:.1f} ms" in pg.inner_text("#path")
        pg.reload()
        pg.wait_for_function(READY, timeout=PAGE_READY_MS)
        again = pg.evaluate("window.edgeDemo.pipe.path")
        assert again["name"] == path["name"] and again["timings"] == t
        assert "timed earlier" in pg.inner_text("#path")
    finally:
        context.close()


def test_onnxruntime_web_that_fails_its_check_or_load_stops_the_page(browser, served,
                                                                    web_package):
    """onnxruntime-web's binary with other bytes (what an integrity check catches), or its
    CDN out of reach: a clear error naming the file or the URL, nothing run. No request
    leaves the machine: the CDN is answered by the test."""
    skip_without_ort(web_package[1])
    size = next(f["bytes"] for f in web_package[1]["web"]["ort"]["files"]
                if f["name"] == "ort-wasm-simd-threaded.wasm")
    cdn = "https://cdn.jsdelivr.net/npm/onnxruntime-web@1.30.0/dist/"
    cases = {
        "tampered": [("**/ort/ort-wasm-simd-threaded.wasm",
                      lambda route: route.fulfill(body=b"\0" * size))],
        "unreachable": [("**/manifest.json", lambda route: rewritten_manifest(
                            route, lambda m: m["web"]["ort"].update(base=cdn))),
                        ("https://cdn.jsdelivr.net/**", lambda route: route.abort())],
    }
    errors = {}
    for name, routes in cases.items():
        context = browser.new_context()
        context.add_init_script(NO_WEBGPU)
        for pattern, handler in routes:
            context.route(pattern, handler)
        pg = context.new_page()
        try:
            pg.goto(served + "index.html")
            pg.wait_for_function(READY, timeout=PAGE_READY_MS)
            assert pg.evaluate("window.edgeDemo.ready") is False
            assert pg.is_disabled("#generate")
            errors[name] = pg.inner_text("#error")
        finally:
            context.close()
    assert errors["tampered"].startswith("onnxruntime-web 1.30.0 could not be loaded")
    assert "ort-wasm-simd-threaded.wasm" in errors["tampered"]
    assert "does not match the manifest" in errors["tampered"]
    assert "nothing was run" in errors["tampered"]
    assert f"could not be loaded from {cdn}" in errors["unreachable"]
    assert "interrupted 3 times" in errors["unreachable"]


def test_page_says_clearly_when_webgpu_is_missing_and_there_is_no_wasm_path(browser, served):
    """A package with the WebGPU path only (exported before the wasm path) in a browser
    without WebGPU: the page says so and offers nothing to run."""
    context = browser.new_context()
    context.add_init_script(NO_WEBGPU)
    context.route("**/manifest.json", lambda route: rewritten_manifest(
        route, lambda m: m["web"].update(paths=["webgpu"])))
    pg = context.new_page()
    try:
        pg.goto(served + "index.html")
        pg.wait_for_selector("#gpu-missing:not([hidden])", timeout=PAGE_READY_MS)
        assert "no WebGPU" in pg.inner_text("#gpu-missing")
        assert pg.is_disabled("#generate")
    finally:
        context.close()


# the adapter as a hardware GPU's (the page then runs WebGPU untimed where it has the path)
HARDWARE_ADAPTER = """if (globalThis.GPUAdapter) {
  Object.defineProperty(GPUAdapter.prototype, "info", { get: () => ({ vendor: "nvidia",
    architecture: "ampere", device: "", description: "patched", isFallbackAdapter: false }) });
  Object.defineProperty(GPUAdapter.prototype, "isFallbackAdapter", { get: () => false });
}"""


def wasm_only_page(browser, served, query: str, init_script: str | None = None) -> dict:
    """The demo page at `query` with the package's manifest answered as a wasm-only
    package's (`paths: ["wasm"]`) where chromium gives an adapter (skipped where it gives
    none): what it shows, and the paths it requested."""
    context = browser.new_context()
    if init_script:
        context.add_init_script(init_script)
    context.route("**/manifest.json", lambda route: rewritten_manifest(
        route, lambda m: m["web"].update(paths=["wasm"])))
    pg = context.new_page()
    requested = []
    pg.on("request", lambda r: requested.append(urlsplit(r.url).path.lstrip("/")))
    try:
        pg.goto(served + "manifest.json")
        skip_without_webgpu(context, pg)
        pg.goto(served + "index.html" + query)
        pg.wait_for_function(READY, timeout=PAGE_READY_MS)
        return {"ready": pg.evaluate("window.edgeDemo.ready"),
                "path": pg.evaluate("window.edgeDemo.pipe && window.edgeDemo.pipe.path"),
                "shown": pg.inner_text("#path"), "error": pg.evaluate("window.edgeDemo.error"),
                "generate_disabled": pg.is_disabled("#generate"), "requested": requested}
    finally:
        context.close()


def test_a_wasm_only_package_runs_wasm_beside_an_adapter(browser, served, web_package):
    """A package exported with --web-paths wasm where chromium gives a WebGPU adapter (the
    mirror of the webgpu-only case above): the page runs wasm without timing the paths or
    fetching a plan, on SwiftShader's adapter and on one that looks like a hardware GPU's,
    and `?path=webgpu` is refused naming the path the package has."""
    skip_without_ort(web_package[1])
    for init_script in (None, HARDWARE_ADAPTER):
        chosen = wasm_only_page(browser, served, "", init_script)
        assert chosen["ready"], chosen["error"]
        assert chosen["path"]["name"] == "wasm" and chosen["path"]["timings"] is None
        assert "the wasm path only" in chosen["shown"], chosen["shown"]
        assert not any(p.startswith("plans/") for p in chosen["requested"])
        assert any(p.startswith("graphs/") for p in chosen["requested"])
    asked = wasm_only_page(browser, served, "?path=webgpu")
    assert asked["ready"] is False and asked["generate_disabled"]
    assert asked["error"] == 'path "webgpu": this package has wasm', asked["error"]
    assert not any(p.startswith(("plans/", "weights/")) for p in asked["requested"])


# what each form field must show whole: its placeholder, or a value a person types
FIELD_TEXTS = {"seed": "123456", "steps": "30", "merge": "15", "cache": "0.05",
               "budget": None, "prompt": "a violet ball drifting to the left"}
MEASURE_FIELDS = """(texts) => {
  const ctx = document.createElement("canvas").getContext("2d"), out = {};
  for (const [id, given] of Object.entries(texts)) {
    const el = document.getElementById(id), cs = getComputedStyle(el);
    ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const text = given ?? el.placeholder;
    const spinner = el.type === "number" ? 20 : 0;   // Chromium's up/down buttons
    out[id] = {text, need: ctx.measureText(text).width + spinner,
               room: el.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight),
               em: parseFloat(cs.fontSize)};
  }
  return out;
}"""


def test_form_fields_fit_what_they_hold(browser, served, tmp_path):
    """Each field shows its placeholder or a typical value whole (the budget's placeholder was
    cut off) and number fields are not many times wider than that. A screenshot is kept."""
    context = browser.new_context()
    context.add_init_script(NO_WEBGPU)  # the form alone, no kernels to compile
    pg = context.new_page()
    try:
        pg.goto(served + "index.html")
        pg.wait_for_function(READY, timeout=PAGE_READY_MS)
        fields = pg.evaluate(MEASURE_FIELDS, FIELD_TEXTS)
        pg.screenshot(path=str(tmp_path / "form.png"))
    finally:
        context.close()
    for name, f in fields.items():
        assert f["need"] <= f["room"], f"{name}: {f['text']!r} needs {f['need']:.0f}px, " \
                                       f"the field shows {f['room']:.0f}px"
        if name in ("seed", "steps", "merge", "cache"):
            assert f["room"] <= 8 * f["em"], f"{name}: {f['room']:.0f}px for {f['text']!r}"
