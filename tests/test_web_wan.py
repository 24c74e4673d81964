"""Wan 2.1 through the web target: a tiny random-weight WanPipeline folder exported with
`--target web` (every launch plan replayed with TVM's llvm build and every wasm graph run by
onnxruntime against PyTorch at export), then run in headless chromium through the documented
API on each path (onnxruntime-web's wasm provider; WebGPU on SwiftShader) and held to
diffusers' own WanPipeline for the same prompt, negative prompt, latents, steps and guidance;
the techniques (leap, step cache, TDTM) give the Python runtime's video on the same noise."""

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

pytestmark = pytest.mark.slow  # headless chromium, a Wan export

PROMPT = "a red circle moving  left"
OPTIONS = {"negative_prompt": "blue dog", "steps": 4, "guidance": 4.0}


@pytest.fixture(scope="module")
def wan_model(wan_models):
    """The tiny Wan with UniPC (conftest: the ONNX package of the same folder is shared)."""
    return wan_models["unipc"]


@pytest.fixture(scope="module")
def wan_web_package(tmp_path_factory, wan_model):
    # with the caption-half variants (`unguided`, `tdtm_unguided`), as `edge export` writes
    return bundled_web_package(tmp_path_factory, "wan-web", wan_model, unguided=True)


@pytest.fixture(scope="module")
def latents(wan_model):
    return np.random.default_rng(7).standard_normal((1, *wan_model.latent_shape),
                                                   dtype=np.float32)


@pytest.fixture(scope="module")
def diffusers_video(wan_model, latents):
    return wan_model.reference(PROMPT, latents=latents, **OPTIONS)[0]


@pytest.fixture(scope="module")
def page(wan_web_package, browser):
    """A page of the served package (pipelines loaded on it by LOAD_PIPE)."""
    root, _ = wan_web_package
    with served_page(browser, root) as (pg, url):
        pg.served = url
        yield pg


@pytest.fixture(scope="module")
def wasm(page):
    """The page with a wasm-path pipeline loaded once for the tests that only use it."""
    assert page.evaluate(LOAD_PIPE, [page.served, "wasm"]) == "wasm"
    return page


def generate(pg, path: str, latents, options=OPTIONS, prompt=PROMPT) -> np.ndarray | str:
    return page_generate(pg, path, prompt, options, latents)


def test_export_checks_every_wan_plan_and_graph(wan_web_package):
    """The export replayed each block's launch plan (and its variants': the decoder's
    first-frame, the transformer's merged and caption-half ones) with TVM's llvm build and
    ran each wasm graph, all within the limit; the decoder is recorded as chunked, frame by
    frame, its caches carried."""
    from edge.exporters.web.package import BLOCK_TOLERANCE

    _, manifest = wan_web_package
    records = [r for c in manifest["components"] for b in c["blocks"]
               for r in (b, *b.get("variants", {}).values())]
    assert {c["name"] for c in manifest["components"]} == {"text_encoder", "transformer",
                                                          "vae_decoder"}
    for r in records:
        assert r["validation"]["max_abs_error"] <= BLOCK_TOLERANCE
        assert r["wasm"]["validation"]["max_abs_error"] <= BLOCK_TOLERANCE
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    assert decoder["chunked"]["first_variant"] == "first" and decoder["chunked"]["state"]
    assert all(set(b["variants"]) == {"first"} for b in decoder["blocks"])
    transformer = next(c for c in manifest["components"] if c["name"] == "transformer")
    assert all(set(b["variants"]) == {"tdtm", "unguided", "tdtm_unguided"}
               for b in transformer["blocks"][1:-1])
    ends = (transformer["blocks"][0], transformer["blocks"][-1])
    assert all(set(b["variants"]) == {"unguided"} for b in ends)


@pytest.mark.parametrize("path", ["wasm", "webgpu"])
def test_each_path_reproduces_wan_pipeline(page, path, latents, diffusers_video):
    if path == "webgpu":
        skip_without_webgpu(page.context, page)
    assert page.evaluate(LOAD_PIPE, [page.served, path]) == path
    got = generate(page, path, latents)
    assert not isinstance(got, str), got
    assert got.shape == diffusers_video.shape  # (T, H, W, 3)
    assert_same_video(got, diffusers_video)


def test_the_negative_prompt_conditions_the_video(wasm, wan_model, latents, diffusers_video):
    """Another negative prompt, another video; none given, the package's own (Wan's "", as
    WanPipeline's default) is encoded for the unconditional pass: diffusers' video for it."""
    other = generate(wasm, "wasm", latents, OPTIONS | {"negative_prompt": "green square"})
    assert not np.array_equal(other, diffusers_video)
    plain = {"steps": OPTIONS["steps"], "guidance": OPTIONS["guidance"]}
    want = wan_model.reference(PROMPT, latents=latents, **plain)[0]
    assert not np.array_equal(want, diffusers_video)
    assert_same_video(generate(wasm, "wasm", latents, plain), want)


def test_wrong_latents_are_refused_and_the_pipeline_goes_on(wasm, latents, diffusers_video):
    error = generate(wasm, "wasm", latents[..., :-1])
    assert isinstance(error, str), "latents of the wrong length were taken"
    assert f"has {latents[..., :-1].size} values" in error and str(latents.size) in error, error
    assert_same_video(generate(wasm, "wasm", latents), diffusers_video)


@pytest.mark.parametrize("technique", [{"leap": True, "leap_after": 4, "leap_steps": 2,
                                        "steps": 8},
                                       {"cache_threshold": 0.3, "steps": 12},
                                       {"merge_steps": 2, "steps": 4},
                                       {"guidance_steps": 3, "cache_threshold": 0.3,
                                        "steps": 12},
                                       {"guidance_steps": 1, "merge_steps": 2, "steps": 4}],
                         ids=["leap", "step-cache", "tdtm", "guidance-cutoff",
                              "cutoff-tdtm"])
def test_techniques_give_the_python_runtimes_video(wasm, wan_packages, latents, technique):
    """Linear Proportional Leap, the step cache, TDTM's merged blocks and the guidance cutoff
    (with the step cache across it) on the page take the same decisions as the Python runtime
    on the same package's ONNX twin and noise."""
    from edge.runtimes.python import Pipeline

    options = {"negative_prompt": "blue dog", "guidance": 4.0, **technique}
    runtime = Pipeline.load(wan_packages["unipc"][0])
    try:
        want = runtime.generate(PROMPT, latents=latents, **options)[0]
        calls = runtime.last_run["sampler"]["transformer_calls"]
        guided, predictions = (runtime.last_run["sampler"][k] for k in ("guided_calls", "calls"))
    finally:
        runtime.close()
    if "merge_steps" not in technique:
        assert calls < technique["steps"]  # the technique did skip transformer calls
    got = generate(wasm, "wasm", latents, options)
    assert not isinstance(got, str), got
    assert_same_video(got, want)
    assert wasm.evaluate("() => window.pipes.wasm.lastRun.transformer_calls") == calls
    assert wasm.evaluate("() => window.pipes.wasm.lastRun.sampler.guided_calls") == guided
    assert guided == technique.get("guidance_steps", predictions)
    # an unguided prediction runs the caption's half alone (its `unguided` or `tdtm_unguided`
    # programs): a batch of one on the page, as the Python runtime ran it
    batches = wasm.evaluate("() => window.pipes.wasm.lastRun.transformer_batches")
    assert batches.count(1) == predictions - guided and batches.count(2) == guided
