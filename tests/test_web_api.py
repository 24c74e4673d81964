"""The web runtime's embedding API (docs/web.md, "Embedding the model in a page"):
`Pipeline.load(url, {budget, path, onProgress, signal})` and `generate(prompt, options)`
with the Python runtime's option names, in Debian's chromium driven by Playwright.

The minimal page is the ```html block of that docs section, written into the package and
opened as it is, so the documentation cannot drift from a page that works. tiny-sora is
exported with `--target web` once for the module; where onnxruntime-web is bundled the
browser has no WebGPU and runs the wasm path (seconds per load, where SwiftShader's WebGPU
takes ~30 s), else the WebGPU path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")
pytest.importorskip("playwright.sync_api", reason="playwright (test extra) is not installed")

# the same onnxruntime-web dist and the same video thresholds as the demo page's tests
from browser import (  # noqa: E402  (after the skips)
    ORT_DIST,
    PAGE_READY_MS,
    VIDEO_B64,
    assert_same_video,
    b64,
    read_video,
    serving,
    skip_without_webgpu,
)

from edge.core.video_metrics import psnr  # noqa: E402

pytestmark = pytest.mark.slow  # headless Chromium

DOCS = Path(__file__).resolve().parents[1] / "docs" / "web.md"
SECTION = "## Embedding the model in a page"
PROMPT = "a red circle moving left"  # what the minimal page generates: seed 3, 10 steps
SEED, STEPS = 3, 10
NO_WEBGPU = "delete Navigator.prototype.gpu;"


def minimal_page_html() -> str:
    """The one ```html block of the docs' embedding section."""
    section = DOCS.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```html\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"{DOCS}: {len(blocks)} html blocks under {SECTION!r}, want 1"
    return blocks[0]


@pytest.fixture(scope="module")
def web_package(tiny_sora_web):
    """conftest.py's tiny-sora web package (shared with tests/test_web_browser.py)."""
    return tiny_sora_web


@pytest.fixture(scope="module")
def context(web_package, browser):
    """One browser context for the module: without WebGPU where the wasm path can run."""
    root, manifest = web_package
    with serving(root) as url:
        ctx = browser.new_context()
        if manifest["web"]["ort"]["bundled"]:
            ctx.add_init_script(NO_WEBGPU)
        else:
            probe = ctx.new_page()
            probe.goto(url + "manifest.json")
            skip_without_webgpu(ctx, probe)
            probe.close()
        ctx.served = url
        yield ctx
        ctx.close()


@pytest.fixture(scope="module")
def minimal(context):
    """The docs' minimal page, opened once and left with its pipeline (window.edge). The
    page is answered by a route, as if it sat beside the package's own index.html (the shared
    package's folder stays as exported)."""
    html = minimal_page_html()
    context.route("**/minimal.html",
                  lambda route: route.fulfill(body=html, content_type="text/html"))
    pg = context.new_page()
    pg.goto(context.served + "minimal.html")
    pg.wait_for_function("window.edge || /Error/.test(document.getElementById('status')"
                         ".textContent)", timeout=PAGE_READY_MS)
    return pg


@pytest.fixture(scope="module")
def python_pipe(exported_package):
    from edge.runtimes.python import Pipeline

    pipe = Pipeline.load(exported_package[0])
    yield pipe
    pipe.close()


FIRST_VIDEO = f"({VIDEO_B64})(window.edge.video)"  # the minimal page's own video


def test_docs_minimal_page_generates_the_python_video(minimal, web_package, python_pipe,
                                                      classifier):
    """The docs' page, as written, loads the model and generates seed 3 in 10 steps: the
    Python runtime's video for that seed and step count (option names map to the same
    meanings), as a Uint8Array (T, H, W, 3), and the prompt's: the attribute classifier
    sees a red subject moving left (its shape tiny-sora draws as a round blob, which the
    classifier reads as a square at 32 x 32)."""
    from edge.eval.metrics import classify
    from edge.models.tiny_sora_data import COLORS, DIRECTIONS

    status = minimal.inner_text("#status")
    assert minimal.evaluate("!!window.edge"), status
    manifest = web_package[1]
    got = read_video(minimal.evaluate(FIRST_VIDEO))
    t, _, _ = manifest["latent_shape"][1:]
    assert got.shape[0] == t and got.shape[3] == 3
    assert re.fullmatch(rf"{t} frames of \d+x\d+", status), status
    assert_same_video(got, python_pipe.generate(PROMPT, seed=SEED, steps=STEPS)[0])
    seen = classify(classifier, got[None])
    assert (list(COLORS)[seen["color"][0]], DIRECTIONS[seen["direction"][0]]) == ("red",
                                                                                 "left")


def test_given_noise_levels_mean_what_they_mean_in_python(minimal, python_pipe):
    """`sigmas` on the page: the Python runtime's video through the same levels (the step
    count is theirs), not the video of the schedule's own spacing at as many steps."""
    levels = [1.0, 0.9, 0.6]
    want = python_pipe.generate(PROMPT, seed=SEED, sigmas=levels)[0]
    own = python_pipe.generate(PROMPT, seed=SEED, steps=len(levels))[0]
    got = generate(minimal, f"{{ seed: {SEED}, sigmas: {levels} }}")
    assert "error" not in got, got
    assert_same_video(read_video(got["video"]), want)
    assert psnr(own, want) < 40, "the given levels change nothing here"


# generate() with the given options (a JavaScript expression), from the minimal page's
# pipeline: the video, or the error's name and message
GENERATE = ("""async ([prompt, options]) => {
  try { const v = await window.edge.pipe.generate(prompt, eval(`(${options})`));
        return { video: (""" + VIDEO_B64 + """)(v) }; }
  catch (err) { return { name: err.name, error: err.message, step: err.step }; } }""")

# counts the blocks the pipeline runs from now on (window.blockRuns)
COUNT_RUNS = """() => { const ex = window.edge.pipe.executor;
  if (!ex.counted) { const run = ex.run.bind(ex);
    ex.run = (...args) => { window.blockRuns += 1; return run(...args); }; ex.counted = true; }
  window.blockRuns = 0; }"""


def generate(pg, options: str, prompt=PROMPT) -> dict:
    return pg.evaluate(GENERATE, [prompt, options])


def test_latents_negative_prompt_and_guidance_mean_what_they_mean_in_python(minimal,
                                                                          python_pipe):
    """latents (diffusers' layout), negative_prompt and guidance given to both runtimes give
    the same video; and the negative prompt does change it (else the check proves nothing)."""
    from edge.core.noise import torch_randn

    shape = minimal.evaluate("window.edge.pipe.latentShape")
    latents = torch_randn((1, *shape), 11)
    negative, guidance = "a blue square", 7.5
    want = python_pipe.generate(PROMPT, latents=latents, negative_prompt=negative,
                                guidance=guidance, steps=STEPS)[0]
    without = python_pipe.generate(PROMPT, latents=latents, guidance=guidance, steps=STEPS)[0]
    assert psnr(without, want) < 40, "the negative prompt changes nothing here"
    got = generate(minimal, f"""{{ latents: new Float32Array(Uint8Array.from(atob('{b64(latents)}'),
        c => c.charCodeAt(0)).buffer), negative_prompt: {negative!r}, guidance: {guidance},
        steps: {STEPS} }}""")
    assert "error" not in got, got
    assert_same_video(read_video(got["video"]), want)


def test_unguided_calls_run_the_caption_half_alone(minimal, web_package, python_pipe):
    """With the `unguided` variants a call without guidance runs a batch of one on the page
    (after a cutoff, and every call at guidance 1), making the Python runtime's video of
    the same settings (an ONNX package, whose graphs take a batch of one); the cutoff
    changes the video, so the check can fail."""
    manifest = web_package[1]
    transformer = next(c for c in manifest["components"] if c["name"] == "transformer")
    for block in transformer["blocks"]:
        unguided = block["variants"]["unguided"]
        latent_like = {s["name"]: s["shape"][0] for s in unguided["inputs"]}
        assert set(latent_like.values()) == {1}, (block["name"], latent_like)
    guided = python_pipe.generate(PROMPT, seed=SEED, steps=3)[0]
    for options, batches in ((dict(guidance_steps=1), [2, 1, 1]),
                             (dict(guidance=1.0), [1, 1, 1])):
        want = python_pipe.generate(PROMPT, seed=SEED, steps=3, **options)[0]
        assert psnr(guided, want) < 40, f"{options} change nothing here"
        js = ", ".join(f"{k}: {v}" for k, v in options.items())
        got = generate(minimal, f"{{ seed: {SEED}, steps: 3, {js} }}")
        assert "error" not in got, got
        assert_same_video(read_video(got["video"]), want)
        assert minimal.evaluate("window.edge.pipe.lastRun.transformer_batches") == batches


def test_a_generation_records_its_phases_walls_in_order(minimal):
    """The page's generate reads as encode -> denoise -> decode with one clock, as the
    Python runtime's: lastRun.wall_s names the text encoder, the transformer and the VAE
    decoder in the order they ran, each a positive time, and a total that holds them."""
    got = generate(minimal, f"{{ seed: {SEED}, steps: 2 }}")
    assert "error" not in got, got
    wall = minimal.evaluate("Object.entries(window.edge.pipe.lastRun.wall_s)")
    assert [name for name, _ in wall] == ["text_encoder", "transformer", "vae_decoder", "total"]
    seconds = dict(wall)
    phases = [seconds[n] for n in ("text_encoder", "transformer", "vae_decoder")]
    assert all(s > 0 for s in phases), seconds
    assert sum(phases) <= seconds["total"] + 1e-6, seconds


def test_python_runtime_on_the_web_package_runs_unguided_calls_alone(web_package,
                                                                     python_pipe):
    """The Python runtime on the web package's wasm graphs (fixed shapes) takes the same
    variants: an unguided call is a batch of one, the video the ONNX package's, without the
    warning a package without the variants gives."""
    import warnings

    from edge.runtimes.python import Pipeline
    from edge.runtimes.python.web_package import wasm_graph_opener

    root = str(web_package[0])   # a str, as Pipeline.load and the opener both take it
    pipe = Pipeline.load(root, open_block=wasm_graph_opener(root))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = pipe.generate(PROMPT, seed=SEED, steps=3, guidance_steps=1)[0]
        assert pipe.last_run["unguided_batch"] == 1
    finally:
        pipe.close()
    assert_same_video(got, python_pipe.generate(PROMPT, seed=SEED, steps=3,
                                                guidance_steps=1)[0])


# (options as JavaScript, the whole message or its start ending in "…")
BAD_OPTIONS = [
    ("{ stpes: 2 }", "unknown generate option(s): stpes; known: cache_threshold, "
                     "decode_noise, decode_noise_scale, decode_timestep, dynamic_guidance, "
                     "guidance, guidance_rescale, guidance_steps, latents, leap, …"),
    ("{ steps: 0 }", "sampler setting steps=0: must be at least 1"),
    ("{ steps: 2.5 }", "sampler setting steps=2.5: must be an integer"),
    ("{ guidance: NaN }", "sampler setting guidance=NaN: must be a finite number"),
    ("{ guidance_rescale: 1.5 }", "sampler setting guidance_rescale=1.5: must be a number "
                                  "from 0 (off) to 1 (the guided velocity wholly rescaled)"),
    ("{ guidance: '5' }", 'sampler setting guidance="5": must be a finite number'),
    ("{ leap: 'yes' }", 'sampler setting leap="yes": must be true or false'),
    ("{ dynamic_guidance: 1 }", "sampler setting dynamic_guidance=1: must be true or false"),
    ("{ dynamic_guidance: true }", "sampler setting dynamic_guidance=True: flow_euler steps "
                                   "through no training timesteps (only cogvideox_ddim does; …"),
    ("{ cache_threshold: -1 }", "sampler setting cache_threshold=-1: must not be negative"),
    ("{ sigmas: [1, 0.5, 0.7] }", "sampler setting sigmas=[1,0.5,0.7]: does not fall: level 2 "
                                  "(0.7) is not below level 1 (0.5)"),
    ("{ sigmas: [0.9, 0.5], steps: 3 }", "sampler setting sigmas=[0.9,0.5]: 2 levels for "
                                         "steps=3 (one level a step)"),
    ("{ sigmas: [1.5, 0.5] }", "sampler setting sigmas=[1.5,0.5]: 1.5 is outside the "
                               "schedule's range (0, 1]"),
    ("{ sigmas: '1,0.5' }", 'sampler setting sigmas="1,0.5": must be a list of numbers or '
                            'None'),
    ("{ merge_steps: 1 }", "merge_steps=1: this package has no 'tdtm' transformer variants"),
    ("{ seed: -1 }", "seed -1 is out of range: a seed is a whole number from 0 to 2^63 - 1"),
    ("{ seed: 1.5 }", "seed 1.5 must be a whole number from 0 to 2^63 - 1"),
    ("{ latents: new Float32Array(5) }", "latents has 5 values; the latents (…"),
    ("{ latents: [0, 1] }", "latents must be a Float32Array of …"),
    ("{ latents: new Float64Array(window.edge.pipe.latentShape.reduce((a, b) => a * b)) }",
     "latents must be a Float32Array of …"),
    ("{ latents: new Float32Array(window.edge.pipe.latentShape.reduce((a, b) => a * b))"
     ".fill(NaN) }", "latents hold NaN or infinity"),
    ("{ seed: 3, latents: new Float32Array(window.edge.pipe.latentShape"
     ".reduce((a, b) => a * b)) }",
     "seed and latents given together: the latents are the initial noise, so give one"),
    ("{ negative_prompt: 3 }", "negative_prompt must be a string, got 3"),
    ("{ onStep: 'print' }", 'onStep must be a function (done, total), got "print"'),
    ("{ signal: 'stop' }", 'signal must be an AbortSignal (AbortController\'s .signal), '
                           'got "stop"'),
]


def test_bad_options_are_refused_by_name_before_any_work(minimal):
    """Each bad option gives an Error naming the option and the value, before any block runs;
    the pipeline then generates as before."""
    minimal.evaluate(COUNT_RUNS)
    got = {options: generate(minimal, options) for options, _ in BAD_OPTIONS}
    got["prompt 42"] = generate(minimal, "{}", prompt=42)
    assert minimal.evaluate("window.blockRuns") == 0
    for options, want in [*BAD_OPTIONS, ("prompt 42", "prompt must be a string, got 42")]:
        assert got[options].get("name") == "Error", (options, got[options])
        message = got[options]["error"]
        if want.endswith("…"):
            assert message.startswith(want[:-1]), (options, message)
        else:
            assert message == want, (options, message)
    after = generate(minimal, f"{{ seed: {SEED}, steps: {STEPS} }}")
    assert "error" not in after, after
    assert minimal.evaluate("window.blockRuns") > 0
    assert_same_video(read_video(after["video"]),
                      read_video(minimal.evaluate(FIRST_VIDEO)))


CANCEL = """async () => {
  const pipe = window.edge.pipe, stop = new AbortController(), seen = [];
  const first = pipe.generate('a red circle', { seed: 1, steps: 3, signal: stop.signal,
    onStep: (done, total) => { seen.push([done, total]); if (done === 1) stop.abort(); } });
  const out = { seen };
  try { await pipe.generate('a second one', { steps: 1 }); out.second = 'ran'; }
  catch (err) { out.second = err.message; }
  try { await first; out.first = 'finished'; }
  catch (err) { out.first = { name: err.name, message: err.message, step: err.step,
                              dom: err instanceof DOMException }; }
  const early = new AbortController(); early.abort();
  window.blockRuns = 0;
  try { await pipe.generate('a red circle', { signal: early.signal }); out.early = 'finished'; }
  catch (err) { out.early = { name: err.name, message: err.message, step: err.step,
                              runs: window.blockRuns }; }
  return out; }"""


def test_cancelled_generation_names_its_step_and_the_next_one_runs(minimal):
    """An AbortController aborted after step 1 of 3: the call rejects with an AbortError naming
    step 2; one aborted before the call runs no block; a second call while one runs is
    refused; afterwards generate gives the same video as before."""
    minimal.evaluate(COUNT_RUNS)
    out = minimal.evaluate(CANCEL)
    assert out["seen"] == [[1, 3]]
    assert out["second"].startswith("generate() is already running on this pipeline")
    assert out["first"] == {"name": "AbortError", "step": 2, "dom": True, "message":
                            "generation cancelled before step 2 of 3 (1 done) (the signal was "
                            "aborted)"}
    assert out["early"] == {"name": "AbortError", "step": 0, "runs": 0, "message":
                            "generation cancelled before the text encoder (the signal was "
                            "aborted)"}
    after = generate(minimal, f"{{ seed: {SEED}, steps: {STEPS} }}")
    assert "error" not in after, after
    assert_same_video(read_video(after["video"]),
                      read_video(minimal.evaluate(FIRST_VIDEO)))


LOADS = """async () => {
  const { Pipeline } = await import('/runtime/pipeline.js');
  const base = new URL('/', location.href).href, out = {};
  const attempt = async (name, options) => {
    try { const pipe = await Pipeline.load(base, options); out[name] = pipe.path.name;
          pipe.destroy(); }
    catch (err) { out[name] = { name: err.name, message: err.message }; } };
  const early = new AbortController(); early.abort();
  await attempt('early', { signal: early.signal });
  const midway = new AbortController();
  out.progressAfterAbort = 0;
  performance.setResourceTimingBufferSize(100000);
  let abortedAt = null;
  // not from the Cache API: every file of this load comes over the network
  await attempt('midway', { signal: midway.signal, useCache: false, onProgress: (got) => {
    if (midway.signal.aborted) out.progressAfterAbort += 1;
    else if (got > 0) { abortedAt = performance.now(); midway.abort(); } } });
  await new Promise((r) => setTimeout(r, 1500));  // time for a download in the background
  out.startedAfterAbort = performance.getEntriesByType('resource')
    .filter((e) => e.startTime >= abortedAt).map((e) => e.name);
  await attempt('typo', { budjet: '64MB' });
  await attempt('budget', { budget: 'lots' });
  await attempt('after', {});
  return out; }"""


def test_load_stops_cleanly_when_aborted(context):
    """A load with an aborted signal fetches nothing; one aborted while downloading rejects
    with an AbortError, reports no progress after and fetches no more files in the background
    (the download in flight is cancelled, no later one starts); unknown options and a bad
    budget are refused by name; a load afterwards works."""
    pg = context.new_page()
    pg.goto(context.served + "manifest.json")
    requested = []
    pg.on("request", lambda r: requested.append(r.url))
    out = pg.evaluate(LOADS)
    pg.close()
    base = context.served
    assert out["early"] == {"name": "AbortError", "message": f"loading {base}: cancelled before "
                            "anything was fetched (the signal was aborted)"}
    assert out["midway"]["name"] == "AbortError", out["midway"]
    assert out["midway"]["message"].startswith(f"loading {base}: "), out["midway"]
    assert "cancelled" in out["midway"]["message"], out["midway"]
    assert out["progressAfterAbort"] == 0
    assert out["startedAfterAbort"] == [], out["startedAfterAbort"]
    assert out["typo"]["message"].startswith("unknown load option(s): budjet; known: budget, ")
    assert out["budget"]["message"].startswith('memory budget "lots": not understood; use e.g. '
                                                   '64MB')
    assert out["after"] in ("wasm", "webgpu"), out["after"]
    assert any(u.endswith("/manifest.json") for u in requested)  # the later loads did fetch


TWO_LOADS = """async () => {
  const { Pipeline } = await import('/runtime/pipeline.js');
  const base = new URL('/', location.href).href;
  const a = await Pipeline.load(base, { path: 'wasm' });
  const b = await Pipeline.load(base, { path: 'wasm' });
  const same = a.executor.ort === b.executor.ort;
  a.destroy(); b.destroy();
  return same; }"""


def test_onnxruntime_web_is_imported_once_per_page(context, web_package):
    """A second load on the page (the same package again, or another naming the same
    onnxruntime-web files) runs on the module the first one imported."""
    if not web_package[1]["web"]["ort"]["bundled"]:
        pytest.skip(f"no onnxruntime-web dist at {ORT_DIST} to bundle: no wasm path to load")
    pg = context.new_page()
    pg.goto(context.served + "manifest.json")
    try:
        assert pg.evaluate(TWO_LOADS) is True
    finally:
        pg.close()


START_LOAD = """() => {
  window.loadDone = false;
  import('/runtime/pipeline.js').then(({ Pipeline }) =>
    Pipeline.load(new URL('/', location.href).href).then(() => { window.loadDone = true; }));
  }"""

CACHED_THEN_LOAD = """async (budget) => {
  const { Pipeline } = await import('/runtime/pipeline.js');
  const { fileRecords, sha256Hex } = await import('/runtime/manifest.js');
  const base = new URL('/', location.href).href;
  const manifest = await (await fetch(base + 'manifest.json')).json();
  const records = new Map(fileRecords(manifest).map((r) => [new URL(r.path, base).href, r]));
  const cache = await caches.open('edge-web-packages-v1');
  const cached = [];
  for (const request of await cache.keys()) {
    const r = records.get(request.url);
    if (!r) continue;
    const bytes = await (await cache.match(request)).arrayBuffer();
    const intact = bytes.byteLength === r.bytes && (await sha256Hex(bytes)) === r.sha256;
    cached.push({ path: r.path, intact });
  }
  const pipe = await Pipeline.load(base, { budget });
  const out = { cached, fromCache: pipe.files.fromCache, path: pipe.path.name,
                streamed: [...pipe.blocks.keys()].filter((k) => pipe.weights.source.streamed(k))
                  .length };
  pipe.destroy();
  return out; }"""


def test_a_tab_closed_mid_download_leaves_only_verified_files_and_the_next_visit_goes_on(
        context, web_package):
    """The tab is closed while a weights file is on its way (the server holds that request
    open): the browser's storage then holds only whole files that match the manifest, and the
    next visit takes them from there (the streamed blocks' read into one reused buffer, under
    a budget) and downloads the rest."""
    root, manifest = web_package
    weights = [f["path"] for c in manifest["components"] for b in c["blocks"]
               for f in b["files"] if f["path"].startswith("weights/")]
    first = context.new_page()
    first.goto(context.served + "manifest.json")
    first.evaluate("caches.delete('edge-web-packages-v1')")
    passed, held = [], []

    def weights_route(route):
        if len(passed) < len(weights) // 2:
            passed.append(route.request.url)
            route.continue_()
        else:
            held.append(route)  # never answered: the download hangs mid-way

    first.route("**/weights/**", weights_route)
    first.evaluate(START_LOAD)
    for _ in range(600):
        if held:
            break
        first.wait_for_timeout(100)
    assert held and not first.evaluate("window.loadDone"), "the load did not reach the held file"
    first.close()  # the tab goes, the download with it

    second = context.new_page()
    second.goto(context.served + "manifest.json")
    # twice the largest block's stored bytes: some blocks streamed on either path (WebGPU
    # counts them as float32, twice their fp16)
    largest = max(sum(t["bytes"] for t in b["weights"]["tensors"])
                  for c in manifest["components"] for b in c["blocks"])
    out = second.evaluate(CACHED_THEN_LOAD, 2 * largest)
    second.close()
    cached_weights = [c for c in out["cached"] if c["path"].startswith("weights/")]
    assert all(c["intact"] for c in out["cached"]), out["cached"]
    assert len(cached_weights) == len(passed)  # every whole file, none of the held one
    # each stored file served from storage (so are onnxruntime-web's, which the records lack)
    assert out["fromCache"] >= len(out["cached"]) and out["path"] in ("wasm", "webgpu")
    assert out["streamed"] > 0
