"""The web target in a real browser: Debian's chromium, driven by Playwright (never a browser of
its own), with a WebGPU adapter (SwiftShader on machines without a GPU). tiny-sora is
exported with `--target web` once per module and served with `edge serve`'s server.

Skips, with the reason, where this machine has no chromium or chromium gives no WebGPU
adapter; CI installs chromium (.ci/run)."""

from __future__ import annotations

import base64
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")
playwright_api = pytest.importorskip("playwright.sync_api",
                                     reason="playwright (test extra) is not installed")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
FIXTURES = Path(__file__).parent / "fixtures" / "sampler"
STEPS = 2             # a short generation keeps SwiftShader's share of the suite small
PSNR_LIMIT_DB = 30.0


def b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def from_b64(text: str, dtype, shape) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype).reshape(shape)


@pytest.fixture(scope="module")
def web_package(tmp_path_factory, pipeline):
    from exporters.web import export_web

    root = tmp_path_factory.mktemp("web") / "tiny-sora-web"
    # without the TDTM variants: they double the transformer's compile time
    # without the TDTM variants (they double the transformer's compile time) and without the
    # llvm replay of every plan (tests/test_web_plan.py checks replays; here the browser runs
    # the plans against PyTorch)
    manifest = export_web(pipeline, root, variants=False, check=False)
    return root, manifest


def test_web_package_verifies_like_every_package(web_package):
    """Same manifest format: read_package checks every file (plans, weight shards, runtime,
    page) by size and sha256; shards stay under the limit; the site files are listed."""
    from edge.package import read_package
    from exporters.web import SHARD_BYTES

    root, _ = web_package
    manifest = read_package(root)
    assert manifest["target"] == "web"
    shards = [root / p for c in manifest["components"] for b in c["blocks"]
              for p in b["weights"]["shards"]]
    assert all(p.stat().st_size <= SHARD_BYTES for p in shards)
    assert len(shards) > sum(len(c["blocks"]) for c in manifest["components"])  # one split
    listed = {f["path"] for f in manifest["files"]}
    assert {"index.html", "app.js", "runtime/pipeline.js", "runtime/executor.js",
            "runtime/vendor/tokenizers.mjs"} <= listed


@pytest.fixture(scope="module")
def served(web_package):
    from edge.serve import make_server

    server = make_server(web_package[0], port=0, quiet=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.url.rstrip("/") + "/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (Debian package `chromium`; .ci/run installs it)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser, served):
    """The demo page, loaded once (kernels compile once: SwiftShader takes ~30 s), with a GPU
    budget under the model's weights: the transformer stays on the GPU, the text encoder and
    the VAE decoder are uploaded at each use."""
    context = browser.new_context()
    pg = context.new_page()
    pg.goto(served + "manifest.json")
    adapter = pg.evaluate("async () => navigator.gpu ? !!(await navigator.gpu.requestAdapter()) "
                          ": 'no navigator.gpu'")
    if adapter is not True:
        context.close()
        pytest.skip(f"chromium gives no WebGPU adapter here ({adapter or 'requestAdapter null'})")
    pg.goto(served + "index.html?budget=64MB")
    pg.wait_for_function("window.edgeDemo && window.edgeDemo.ready !== undefined",
                         timeout=180_000)
    assert pg.evaluate("window.edgeDemo.ready"), pg.evaluate("window.edgeDemo.error")
    yield pg
    context.close()


# one block of the loaded package, run alone by the page's executor on given inputs; weights
# uploaded here (not through the page's budgeted loader, whose counts a later test checks)
RUN_BLOCK = """async ({key, inputs}) => {
  const pipe = window.edgeDemo.pipe, ex = pipe.executor, block = pipe.blocks.get(key);
  const bytes = pipe.weights.bytesOf(key), weights = {};
  for (const t of block.record.weights.tensors) {
    weights[t.name] = ex.upload(new Uint8Array(bytes, t.offset, t.bytes));
  }
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


def test_transformer_pair_on_webgpu_matches_pytorch(page, pipeline):
    """One block alone on its example inputs (the end-to-end test below runs them all), with
    each of the exporter's kernel schedules (TVM's tiled matmul and the alternative)."""
    from exporters.tvm_plan import web_example
    from exporters.web import web_blocks

    block = web_blocks(pipeline)["transformer"][1]
    inputs = {n: b64(t.numpy()) for n, t in zip(block.inputs, web_example(block), strict=True)}
    want = [t.numpy() for t in block.run(*block.example)]
    for pick in (0, 1):
        page.evaluate(FORCE_CHOICE, [block.key, pick])
        try:
            got = page.evaluate(RUN_BLOCK, {"key": block.key, "inputs": inputs})
        finally:
            page.evaluate("() => { window.edgeDemo.pipe.executor.choices = window.savedChoices; }")
        for text, w in zip(got, want, strict=True):
            g = from_b64(text, np.float32, w.shape)
            assert np.abs(g - w).max() < 1e-4, (block.key, pick)


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
    """The JS sampler reaches the decisions and numbers recorded from edge/sampler.py."""
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
        const trace = {};
        const x = await s.sample(async (x, t, step) => [vel[step.index], vel[step.index]],
          Float32Array.from(f.noise.flat(Infinity)), s.checkSettings(f.settings), null, trace);
        out[name] = { calls: trace.calls, leap_at: trace.leap_at, cosines: trace.cosines,
                      latent: [...x] };
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
        np.testing.assert_allclose(got[name]["cosines"], expected["cosines"], rtol=0, atol=1e-12)
        assert np.array_equal(np.float32(got[name]["latent"]),
                              np.float32(expected["latent"]).ravel()), name


def test_sampler_timesteps_match_python_bit_for_bit(page):
    from edge.sampler import SamplerSettings, timesteps

    for steps, shift in [(30, 3.0), (6, 3.0), (1, 1.0), (7, 2.5)]:
        want = timesteps(SamplerSettings(steps=steps, shift=shift))
        got = page.evaluate("""async ([steps, shift]) => {
          const s = await import('/runtime/sampler.js');
          return [...s.timesteps(s.checkSettings({steps, shift}))];
        }""", [steps, shift])
        assert np.array_equal(np.float32(got), want), (steps, shift)


def test_corrupt_shard_is_refetched_then_refused(page, web_package, served, tmp_path):
    """A cached shard that fails its sha256 is dropped and fetched again; a server copy that
    is damaged too gives an error naming the file."""
    root, manifest = web_package
    record = manifest["components"][2]["blocks"][0]["files"][1]
    script = """async (record) => {
      const { PackageFiles } = await import('/runtime/loader.js');
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
    path = root / record["path"]
    original = path.read_bytes()
    try:
        path.write_bytes(b"\0" * len(original))
        out = page.evaluate(script, record)
    finally:
        path.write_bytes(original)
    assert record["path"] in out["error"] and "also after fetching it again" in out["error"]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_demo_page_generates_the_python_video(page, served, pipeline, web_package, tmp_path):
    """The demo page, given the Python runtime's initial noise, generates frames matching
    the PyTorch pipeline's (the reference the Python runtime is checked against)."""
    from edge.sampler import initial_noise

    prompt, seed = "a red circle moving left", 3
    noise = initial_noise(pipeline.latent_shape, [seed])[0]
    resident = set(page.evaluate("[...window.edgeDemo.pipe.weights.resident.keys()]"))
    page.fill("#prompt", prompt)
    page.fill("#steps", str(STEPS))
    run = page.evaluate("""async (noise) => window.edgeDemo.generate({ noise:
        new Float32Array(Uint8Array.from(atob(noise), c => c.charCodeAt(0)).buffer) })""",
                        b64(noise))
    frames = page.evaluate("""() => { const f = window.edgeDemo.lastFrames;
        let t = ''; for (let j = 0; j < f.frames.length; j += 8192)
          t += String.fromCharCode(...f.frames.subarray(j, j + 8192));
        return { data: btoa(t), shape: f.shape }; }""")
    got = from_b64(frames["data"], np.uint8, frames["shape"])
    want = pipeline.generate(prompt, seed=seed, steps=STEPS)[0]
    page.screenshot(path=str(tmp_path / "demo.png"))
    assert got.shape == want.shape
    value = psnr(got, want)
    assert value >= PSNR_LIMIT_DB, f"PSNR {value:.1f} dB"
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


def test_gpu_residency_follows_the_python_loader(page):
    """planPins (GPU budget) makes the Python loader's choices on the same sizes, and refuses
    a budget under the largest block naming it."""
    from runtimes.python.loader import plan_pins

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


def test_page_says_clearly_when_webgpu_is_missing(browser, served):
    context = browser.new_context()
    context.add_init_script("delete Navigator.prototype.gpu;")
    pg = context.new_page()
    try:
        pg.goto(served + "index.html")
        pg.wait_for_selector("#gpu-missing:not([hidden])", timeout=30_000)
        assert "no WebGPU" in pg.inner_text("#gpu-missing")
        assert pg.is_disabled("#generate")
    finally:
        context.close()
