"""CogVideoX and LTX-Video through the web target: tiny random-weight folders exported with
`--target web` (every launch plan replayed with TVM's llvm build and every wasm graph run by
onnxruntime against PyTorch at export), then run in headless chromium through the documented
API on each path (onnxruntime-web's wasm provider; WebGPU on SwiftShader) and held to
diffusers' own pipeline for the same prompt, negative prompt, latents, steps and guidance
(tests/test_web_wan.py does the same for Wan 2.1, with the techniques); LTX-Video's
timestep-conditioned decoder with its decode timestep and noise, given or drawn for a
seed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")
pytest.importorskip("playwright.sync_api", reason="playwright (test extra) is not installed")

from browser import (  # noqa: E402  (after the skips)
    LOAD_PIPE,
    assert_same_video,
    bundled_web_package,
    page_generate,
    served_page,
    skip_without_webgpu,
)
from conftest import TEST_CHUNK_ROWS  # noqa: E402
from graph_shapes import softmax_rows  # noqa: E402

pytestmark = pytest.mark.slow  # web exports and headless chromium

PROMPT = "a red circle moving  left"
OPTIONS = {"negative_prompt": "blue dog", "steps": 4, "guidance": 4.0}
# name -> (models fixture, key): conftest.py's tiny models (their ONNX twins there too):
# CogVideoX 5B's rotary shape; LTX's plain decoder; a timestep-conditioned decoder (0.9.5's
# shape) with LTX's example decode settings
MODELS = {"cogvideox-5b": ("cog", "5b"), "ltx": ("ltx", "plain"),
          "ltx-timestep": ("ltx", "timestep")}


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory):
    """(model, web package root, manifest, the same model's ONNX package root)."""
    family, key = MODELS[request.param]
    model = request.getfixturevalue(f"{family}_models")[key]
    twin = request.getfixturevalue(f"{family}_packages")[key][0]
    root, manifest = bundled_web_package(tmp_path_factory, f"web-{request.param}", model)
    return model, root, manifest, twin


def test_export_checks_every_plan_and_graph(exported):
    from edge.exporters.web.package import BLOCK_TOLERANCE

    model, root, manifest, _ = exported
    records = [r for c in manifest["components"] for b in c["blocks"]
               for r in (b, *b.get("variants", {}).values())]
    for r in records:
        assert r["validation"]["max_abs_error"] <= BLOCK_TOLERANCE
        assert r["wasm"]["validation"]["max_abs_error"] <= BLOCK_TOLERANCE
    transformer = next(c for c in manifest["components"] if c["name"] == "transformer")
    assert all(set(b["variants"]) == {"tdtm"} for b in transformer["blocks"][1:-1])
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    assert ("chunked" in decoder) == ("vae_decoder" in model.chunked)
    # the wasm path's graphs chunk every attention (conftest.py's rows), none fused
    wasm_rows = [r for g in root.glob("graphs/**/*.onnx") for r in softmax_rows(g)]
    assert wasm_rows and max(wasm_rows) <= TEST_CHUNK_ROWS


def decode_noise(model, seed: int) -> tuple[np.ndarray | None, dict]:
    """A conditioned decoder's noise given beside given latents (for the page), and the
    reference's seed that gives it: LTXPipeline draws it first from its generator when the
    latents are given."""
    from edge.core.noise import torch_randn

    if getattr(model, "decode", None) is None:
        return None, {}
    return torch_randn(model.latent_shape, seed), {"seed": seed}


@pytest.mark.parametrize("path", ["wasm", "webgpu"])
def test_the_page_reproduces_the_pipeline(exported, browser, path):
    model, root, _, _ = exported
    latents = np.random.default_rng(7).standard_normal((1, *model.latent_shape),
                                                       dtype=np.float32)
    page_noise, reference_seed = decode_noise(model, 5)
    want = model.reference(PROMPT, latents=latents, **OPTIONS, **reference_seed)[0]
    with served_page(browser, root) as (pg, url):
        if path == "webgpu":
            skip_without_webgpu(pg.context, pg)
        assert pg.evaluate(LOAD_PIPE, [url, path]) == path
        got = page_generate(pg, path, PROMPT, OPTIONS, latents, page_noise)
        assert not isinstance(got, str), got
        # another negative prompt gives another video: the page conditions on it (the
        # runtime's code for both paths; asked once, on the faster one)
        other = None
        if path == "wasm":
            other = page_generate(pg, path, PROMPT,
                                  OPTIONS | {"negative_prompt": "green square"}, latents,
                                  page_noise)
            assert not isinstance(other, str), other
    assert_same_video(got, want)
    assert other is None or not np.array_equal(other, got)


def test_a_seed_means_the_pipelines_noise_decode_noise_included(exported, browser):
    """For a seed the page draws what the pipeline draws from
    `generator=torch.Generator().manual_seed(seed)`: the latents and, for a conditioned
    decoder, the decode noise after them (noise.js torchRandnDraws); decode settings a
    package cannot use are refused by name."""
    model, root, _, _ = exported
    want = model.reference(PROMPT, seed=3, **OPTIONS)[0]
    latents = np.zeros((1, *model.latent_shape), np.float32)
    with served_page(browser, root) as (pg, url):
        assert pg.evaluate(LOAD_PIPE, [url, "wasm"]) == "wasm"
        got = page_generate(pg, "wasm", PROMPT, OPTIONS | {"seed": 3}, None)
        no_noise = page_generate(pg, "wasm", PROMPT, OPTIONS, latents)
        bad_t = page_generate(pg, "wasm", PROMPT, OPTIONS | {"decode_timestep": "x"}, latents)
    assert not isinstance(got, str), got
    assert_same_video(got, want)
    if getattr(model, "decode", None) is None:   # CogVideoX, a plain LTX decoder
        assert not isinstance(no_noise, str)
        assert bad_t == ("this package's decoder takes no decode timestep or noise (the "
                         "manifest has no 'decode')")
    else:
        assert no_noise == ("decode noise scale 0.025 with given latents: pass decode_noise "
                            "too (diffusers draws it from the pipeline's generator), or "
                            "decode_noise_scale: 0")
        assert bad_t == 'decode_timestep "x" must be a finite number'


def test_the_page_refuses_decode_settings_that_do_not_fit_the_decoder(exported, browser):
    """The manifest's `decode` and a decoder taking decode_t, decode_noise_scale and
    decode_noise go together, as the Python runtime checks (manifest.js checkManifest)."""
    _, root, manifest, _ = exported
    takes = "decode" in manifest
    edits = {"absent": None, "bad": {"timestep": "0.05", "noise_scale": None}} if takes \
        else {"added": {"timestep": 0.05, "noise_scale": None}}
    with served_page(browser, root) as (pg, url):
        out = pg.evaluate("""async ([url, manifest, edits]) => {
          const { checkManifest } = await import(new URL('runtime/manifest.js', url).href);
          const out = {};
          const cases = [["as written", manifest.decode], ...Object.entries(edits)];
          for (const [name, decode] of cases) {
            const m = { ...manifest };
            if (decode === null || decode === undefined) delete m.decode;
            else m.decode = decode;
            try { checkManifest(m, 'manifest.json'); out[name] = null; }
            catch (err) { out[name] = err.message; }
          }
          return out; }""", [url, manifest, edits])
    assert out.pop("as written") is None
    if takes:
        assert out["absent"] == ("manifest.json: the vae_decoder takes decode_noise, "
                                 "decode_noise_scale, decode_t but the manifest has no "
                                 "'decode' settings")
        assert out["bad"].startswith('manifest.json decode: must be {"timestep": number')
    else:
        assert out["added"].startswith("manifest.json decode: needs a whole-video vae_decoder")


# one leap (for DDIM one jump to the clean sample its v-prediction gives; for LTX's flow a
# re-planned tail) with TDTM's merged blocks for the first steps, then the step cache
TECHNIQUES = {"cogvideox": [{"leap": True, "leap_after": 4, "merge_steps": 2, "steps": 6},
                            {"cache_threshold": 0.3, "steps": 8}],
              "ltx": [{"leap": True, "leap_after": 3, "leap_steps": 2, "merge_steps": 2,
                       "steps": 6},
                      {"cache_threshold": 0.3, "steps": 8}]}


def test_techniques_give_the_python_runtimes_video(exported, browser):
    """Leap, TDTM and the step cache on the page (wasm path) take the Python runtime's
    decisions on the same model's ONNX package and noise: the same video and transformer
    calls, each run skipping calls."""
    from edge.runtimes.python import Pipeline

    model, root, _, twin = exported
    latents = np.random.default_rng(8).standard_normal((1, *model.latent_shape),
                                                       dtype=np.float32)
    page_noise, _ = decode_noise(model, 6)
    extra = {} if page_noise is None else {"decode_noise": page_noise[None]}
    runs = []
    runtime = Pipeline.load(twin)
    try:
        for technique in TECHNIQUES[model.family]:
            options = {"negative_prompt": "blue dog", "guidance": 4.0, **technique}
            want = runtime.generate(PROMPT, latents=latents, **options, **extra)[0]
            runs.append((options, want, runtime.last_run["sampler"]))
    finally:
        runtime.close()
    with served_page(browser, root) as (pg, url):
        assert pg.evaluate(LOAD_PIPE, [url, "wasm"]) == "wasm"
        for options, want, trace in runs:
            assert trace["transformer_calls"] < options["steps"], trace  # it did skip calls
            got = page_generate(pg, "wasm", PROMPT, options, latents, page_noise)
            assert not isinstance(got, str), got
            assert_same_video(got, want)
            made = pg.evaluate("() => window.pipes.wasm.lastRun.sampler")
            keys = ("calls", "transformer_calls", "leap_at", "merged_calls")
            assert {k: made[k] for k in keys} == {k: trace[k] for k in keys}
            if "merge_steps" in options:
                assert trace["merged_calls"] == options["merge_steps"]
