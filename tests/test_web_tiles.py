"""Wan 2.1's decoder in spatial tiles on the web target: a program per tile size (static
shapes), the page blending the tiles as diffusers' `AutoencoderKLWan.tiled_decode` does.

The tiny Wan folder's VAE tiles at 32 pixels with a stride of 16 across (conftest's
WAN_TILING, diffusers' `enable_tiling(32, 32, 32, 16)`): its 4 x 6 latents are decoded as
tiles of 4 x 4, 4 x 4 and 4 x 2 latents, so the package holds the decoder's stages at 4 x 4
and their `tile_4x2` and `first_tile_4x2` variants. The page's video, on each path, equals
WanPipeline's with the same tiling, and is told apart from its untiled video."""

from __future__ import annotations

import json
import shutil

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
from conftest import WAN_TILING  # noqa: E402

from edge.core.video_metrics import psnr  # noqa: E402

pytestmark = pytest.mark.slow  # headless chromium, a Wan export

PROMPT = "a red circle moving  left"
OPTIONS = {"negative_prompt": "blue dog", "steps": 2, "guidance": 4.0}


@pytest.fixture(scope="module")
def tiled_package(tmp_path_factory, wan_tiled):
    return bundled_web_package(tmp_path_factory, "wan-tiles-web", wan_tiled, variants=False)


@pytest.fixture(scope="module")
def latents(wan_tiled):
    return np.random.default_rng(7).standard_normal((1, *wan_tiled.latent_shape),
                                                   dtype=np.float32)


@pytest.fixture(scope="module")
def diffusers_videos(wan_tiled, latents):
    """WanPipeline's video with the VAE tiled, and without tiles."""
    vae = wan_tiled.pipe.vae
    tiled = wan_tiled.reference(PROMPT, latents=latents, **OPTIONS)[0]
    vae.disable_tiling()
    try:
        whole = wan_tiled.reference(PROMPT, latents=latents, **OPTIONS)[0]
    finally:
        vae.enable_tiling(*WAN_TILING)
    # the tiles must make a difference the checks can see
    assert psnr(whole, tiled) < 35.0
    return tiled, whole


def test_the_decoder_is_exported_at_each_tile_size(tiled_package):
    """The manifest says how the decoder tiles; each stage is traced at the first tile
    (4 x 4 latents) with the 4 x 2 tile's programs as variants, whose plans were replayed
    against PyTorch at export like every block's."""
    from edge.exporters.web.package import BLOCK_TOLERANCE

    _, manifest = tiled_package
    decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
    assert decoder["tiles"] == {"latent_size": [4, 4], "latent_stride": [4, 2], "scale": 8}
    assert decoder["blocks"][0]["inputs"][0]["shape"] == [1, 16, 1, 4, 4]
    for block in decoder["blocks"]:
        variants = block["variants"]
        assert set(variants) == {"first", "tile_4x2", "first_tile_4x2"}, block["name"]
        for name in ("tile_4x2", "first_tile_4x2"):
            assert variants[name]["outputs"][0]["shape"][-1] * 2 \
                == block["outputs"][0]["shape"][-1], (block["name"], name)
            for check in (variants[name]["validation"], variants[name]["wasm"]["validation"]):
                assert check["max_abs_error"] <= BLOCK_TOLERANCE * max(
                    1.0, check["reference_max_abs"]), (block["name"], name, check)


@pytest.mark.parametrize("path", ["wasm", "webgpu"])
def test_the_page_decodes_in_tiles_as_wan_pipeline(browser, tiled_package, path, latents,
                                                   diffusers_videos):
    root, _ = tiled_package
    tiled, whole = diffusers_videos
    with served_page(browser, root) as (pg, url):
        if path == "webgpu":
            skip_without_webgpu(pg.context, pg)
        assert pg.evaluate(LOAD_PIPE, [url, path]) == path
        got = page_generate(pg, path, PROMPT, OPTIONS, latents)
    assert not isinstance(got, str), got
    assert_same_video(got, tiled)
    assert psnr(got, whole) < 35.0


def test_the_python_runtime_decodes_the_package_in_tiles(tiled_package, latents,
                                                         diffusers_videos):
    """The Python runtime on the package's wasm graphs picks each tile's programs alike."""
    from edge.runtimes.python import Pipeline
    from edge.runtimes.python.web_package import wasm_graph_opener

    root, _ = tiled_package
    runtime = Pipeline.load(root, open_block=wasm_graph_opener(root))
    try:
        got = runtime.generate(PROMPT, latents=latents, **OPTIONS)[0]
    finally:
        runtime.close()
    assert_same_video(got, diffusers_videos[0])


CHECK_MANIFEST = """async ([url, manifest]) => {
  const m = await import(new URL('runtime/manifest.js', url).href);
  try { m.checkManifest(manifest, 'the package'); return null; }
  catch (err) { return err.message; } }"""


def test_a_package_without_a_tile_sizes_program_is_refused(browser, tiled_package, tmp_path):
    """A decoder block without the variant a tile size needs, or traced at another size than
    the first tile, is refused at load by the Python checks and the page's, naming both."""
    from edge.core.manifest_schema import PackageError, check_manifest

    root, manifest = tiled_package
    missing = json.loads(json.dumps(manifest))
    decoder = next(c for c in missing["components"] if c["name"] == "vae_decoder")
    del decoder["blocks"][2]["variants"]["first_tile_4x2"]
    resized = json.loads(json.dumps(manifest))
    decoder = next(c for c in resized["components"] if c["name"] == "vae_decoder")
    decoder["tiles"]["latent_size"] = [4, 3]
    site = tmp_path / "site"
    shutil.copytree(root / "runtime", site / "runtime")
    with served_page(browser, site) as (pg, url):
        for broken, words in ((missing, ["up_1", "'first_tile_4x2'", "4x2"]),
                              (resized, ["head", "4x4", "4x3"])):
            broken.pop("manifest_sha256", None)
            with pytest.raises(PackageError) as err:
                check_manifest(broken)
            page_error = pg.evaluate(CHECK_MANIFEST, [url, broken])
            for message in (str(err.value), page_error):
                assert all(w in message for w in words), message
