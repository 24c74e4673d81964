"""CogVideoX and LTX-Video through the web target: tiny random-weight folders exported with
`--target web` (every launch plan replayed with TVM's llvm build and every wasm graph run by
onnxruntime against PyTorch at export), then run in headless chromium through the documented
API on each path (onnxruntime-web's wasm provider; WebGPU on SwiftShader) and held to
diffusers' own pipeline for the same prompt, negative prompt, latents, steps and guidance
(tests/test_web_wan.py does the same for Wan 2.1, with the techniques)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm", reason="apache-tvm (test extra) is not installed")
pytest.importorskip("playwright.sync_api", reason="playwright (test extra) is not installed")

from browser import (  # noqa: E402  (after the skips)
    LOAD_PIPE,
    ORT_DIST,
    assert_same_video,
    page_generate,
    serving,
    skip_without_webgpu,
)

from edge.families import load_model  # noqa: E402

pytestmark = pytest.mark.slow  # web exports and headless chromium

PROMPT = "a red circle moving  left"
SIZE = {"height": 32, "width": 64, "frames": 17}
OPTIONS = {"negative_prompt": "blue dog", "steps": 4, "guidance": 4.0}


def cogvideox_5b(root):
    from cogvideox_folder import make_cogvideox_folder

    return load_model(make_cogvideox_folder(root / "cog", rotary=True), steps=6, **SIZE)


def ltx_plain(root):
    from ltx_folder import make_ltx_folder

    return load_model(make_ltx_folder(root / "ltx", timestep_decoder=False), steps=4, **SIZE)


MODELS = {"cogvideox-5b": cogvideox_5b, "ltx": ltx_plain}


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory):
    """(model, web package root, manifest) of one family's tiny folder."""
    from exporters.web import export_web

    if not (ORT_DIST / "ort.wasm.min.mjs").is_file():
        pytest.skip(f"no onnxruntime-web dist at {ORT_DIST} (EDGE_ORT_WEB_DIST) to bundle")
    root = tmp_path_factory.mktemp(request.param)
    model = MODELS[request.param](root)
    return model, root / "web", export_web(model, root / "web", bundle_ort=ORT_DIST)


def test_export_checks_every_plan_and_graph(exported):
    from exporters.web import BLOCK_TOLERANCE

    model, _, manifest = exported
    records = [r for c in manifest["components"] for b in c["blocks"]
               for r in (b, *b.get("variants", {}).values())]
    for r in records:
        assert r["validation"]["max_abs_error"] <= BLOCK_TOLERANCE
        assert r["wasm"]["validation"]["max_abs_error"] <= BLOCK_TOLERANCE
    transformer = next(c for c in manifest["components"] if c["name"] == "transformer")
    assert all(set(b["variants"]) == {"tdtm"} for b in transformer["blocks"][1:-1])
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    assert ("chunked" in decoder) == ("vae_decoder" in model.chunked)


@pytest.mark.parametrize("path", ["wasm", "webgpu"])
def test_the_page_reproduces_the_pipeline(exported, browser, path):
    model, root, _ = exported
    latents = np.random.default_rng(7).standard_normal((1, *model.latent_shape),
                                                       dtype=np.float32)
    want = model.reference(PROMPT, latents=latents, **OPTIONS)[0]
    with serving(root) as url:
        ctx = browser.new_context()
        try:
            pg = ctx.new_page()
            pg.goto(url + "manifest.json")
            if path == "webgpu":
                skip_without_webgpu(ctx, pg)
            assert pg.evaluate(LOAD_PIPE, [url, path]) == path
            got = page_generate(pg, path, PROMPT, OPTIONS, latents)
            assert not isinstance(got, str), got
            # another negative prompt gives another video: the page conditions on it
            other = page_generate(pg, path, PROMPT,
                                  OPTIONS | {"negative_prompt": "green square"}, latents)
        finally:
            ctx.close()
    assert_same_video(got, want)
    assert not np.array_equal(other, got)


def test_a_timestep_conditioned_ltx_decoder_is_refused_for_the_page(tmp_path):
    """The page's runtime does not feed the decode timestep and noise (the manifest's
    `decode`) yet: such a folder is refused by name before any work."""
    from ltx_folder import make_ltx_folder
    from typer.testing import CliRunner

    from edge.cli import app

    folder = make_ltx_folder(tmp_path / "ltx", timestep_decoder=True)
    out = tmp_path / "pkg"
    res = CliRunner().invoke(app, ["export", "--model", str(folder), "--target", "web",
                                   "-o", str(out), "--height", "32", "--width", "64",
                                   "--frames", "17"])
    assert res.exit_code != 0, res.output
    assert "vae/config.json has timestep_conditioning" in res.output
    assert "the page's runtime does not feed" in res.output
    assert not out.exists()
