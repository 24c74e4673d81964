"""Wan 2.2 TI2V-5B's text-to-video shape in the Wan family, on a tiny random-weight folder
(tests/wan_folder.py version "2.2"): per-token timesteps (`expand_timesteps`), a 48-channel
residual VAE with patch size 2 (16x spatial). The cut equals diffusers' components (the
transformer against its 2-D timestep path), the decoder's rewritten pieces equal diffusers'
own, and the ONNX package run by the Python runtime reproduces diffusers' WanPipeline."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import WAN22_SIZE
from wan_folder import diffusers_frames

from edge.families import FamilyError, load_model
from edge.graph.blocks import run_chain, run_chunked

SIZE = WAN22_SIZE   # 16x spatial: latents 48 x 3 x 2 x 4
# wan22_folder, wan22, wan22_package, wan22_iphone_package: conftest.py (the family contract
# runs its package's checks: tests/test_family_contract.py)


@torch.no_grad()
def test_cut_equals_diffusers_with_per_token_timesteps(wan22):
    """WanPipeline with expand_timesteps hands the transformer one timestep per token (all
    equal in text to video); the cut's prologue takes one per video and computes the same.
    The residual decoder, run latent frame by latent frame, equals vae.decode."""
    assert wan22.pipe.config.expand_timesteps and wan22.latent_shape == (48, 3, 2, 4)
    cut = wan22.cut()
    latent = torch.randn(2, *wan22.latent_shape, generator=torch.Generator().manual_seed(0))
    caption = torch.randn(2, wan22.text_tokens, 32, generator=torch.Generator().manual_seed(1))
    _, t, h, w = wan22.latent_shape
    per_token = torch.tensor([999.0, 500.0])[:, None].expand(2, t * (h // 2) * (w // 2))
    want = wan22.pipe.transformer(latent, per_token, caption, return_dict=False)[0]
    got = run_chain(cut["transformer"], {"latent": latent, "t": torch.tensor([0.999, 0.5]),
                                      "caption": caption})["velocity"]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)

    z = torch.randn(1, *wan22.latent_shape, generator=torch.Generator().manual_seed(2))
    want = diffusers_frames(wan22.pipe.vae, z)
    got = run_chunked(cut["vae_decoder"], wan22.chunked["vae_decoder"], {"z": z})["frames"]
    assert got.shape == (1, 3, SIZE["frames"], SIZE["height"], SIZE["width"])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@torch.no_grad()
def test_rewritten_decoder_pieces_equal_diffusers(wan22):
    """The residual up block's shortcut (DupUp3D, to rank 8 in diffusers) and unpatchify
    (rank 7), written with ranks of 5 at most, compute exactly what diffusers' do; the
    rewritten block keeps the block's parameter names."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify as theirs_unpatchify

    from edge.families.wan.networks import GraphFriendlyResidualUpBlock, duplicate_up, unpatchify

    g = torch.Generator().manual_seed(3)
    blocks = [b for b in wan22.pipe.vae.decoder.up_blocks if b.avg_shortcut is not None]
    assert {b.avg_shortcut.factor_t for b in blocks} == {1, 2}
    for block in blocks:
        dup = block.avg_shortcut
        x = torch.randn(1, dup.in_channels, 1, 3, 5, generator=g)
        for first in (False, True):
            want = dup(x, first_chunk=first)
            got = duplicate_up(x, dup.out_channels, dup.factor_t, dup.factor_s, first)
            assert torch.equal(got, want), (dup.factor_t, first)
        ours = GraphFriendlyResidualUpBlock(block)
        assert dict(ours.named_parameters()).keys() == dict(block.named_parameters()).keys()
        theirs_cache, ours_cache = [None] * 16, [None] * 16
        for frame in range(3):
            x = torch.randn(1, block.in_dim, 1, 3, 5, generator=g)
            want = block(x, feat_cache=theirs_cache, feat_idx=[0], first_chunk=frame == 0)
            got = ours(x, feat_cache=ours_cache, feat_idx=[0], first_chunk=frame == 0)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    x = torch.randn(1, 12, 4, 3, 5, generator=g)
    assert torch.equal(unpatchify(x, 2), theirs_unpatchify(x, 2))


def test_a14b_is_refused_by_name(wan22_folder, tmp_path):
    folder = tmp_path / "a14b"
    shutil.copytree(wan22_folder, folder)
    index = json.loads((folder / "model_index.json").read_text())
    index |= {"boundary_ratio": 0.875, "transformer_2": ["diffusers", "WanTransformer3DModel"]}
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(FamilyError, match=r"model_index.json: .*A14B.*not supported"):
        load_model(folder, **SIZE)


def test_a_patched_vae_must_give_rgb_patches(wan22_folder, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(wan22_folder, folder)
    config = json.loads((folder / "vae" / "config.json").read_text())
    (folder / "vae" / "config.json").write_text(json.dumps(config | {"out_channels": 3}))
    with pytest.raises(FamilyError, match=r"vae/config.json: out_channels=3 with patch_size=2;"
                                          r" .* = 12 channels"):
        load_model(folder, **SIZE)


@pytest.mark.slow  # a web export and headless chromium
def test_the_page_reproduces_wan_pipeline_on_the_wasm_path(wan22, tmp_path, browser):
    """The web target takes Wan 2.2 as it takes 2.1 (tests/test_web_wan.py runs both paths
    and the plans' llvm replay on 2.1): the page, through the embedding API, gives
    WanPipeline's video for the same prompt, negative prompt, latents, steps, guidance. The
    package holds the wasm path alone (`--web-paths wasm`): no TVM compile for a path this
    test does not run."""
    from browser import LOAD_PIPE, ORT_DIST, assert_same_video, page_generate, served_page

    from edge.exporters.web.package import export_web

    if not (ORT_DIST / "ort.wasm.min.mjs").is_file():
        pytest.skip(f"no onnxruntime-web dist at {ORT_DIST} (EDGE_ORT_WEB_DIST) to bundle")
    root = tmp_path / "web"
    export_web(wan22, root, variants=False, bundle_ort=ORT_DIST, paths=("wasm",))
    assert not (root / "plans").exists()
    latents = np.random.default_rng(7).standard_normal((1, *wan22.latent_shape),
                                                       dtype=np.float32)
    options = {"negative_prompt": "blue dog", "steps": 4, "guidance": 4.0}
    want = wan22.reference("a red circle moving  left", latents=latents, **options)[0]
    with served_page(browser, root) as (pg, url):
        assert pg.evaluate(LOAD_PIPE, [url, "wasm"]) == "wasm"
        got = page_generate(pg, "wasm", "a red circle moving  left", options, latents)
    assert not isinstance(got, str), got
    assert_same_video(got, want)


def test_scale_model_writes_wan22_shapes(tmp_path, monkeypatch):
    """`edge scale-model --like wan2.2-ti2v-5b` writes Wan 2.2 TI2V-5B's shapes: checked on
    the meta device at real size (5.00 B transformer parameters, a 705 M VAE), and the same
    code path written at a small size that the family loads as a Wan 2.2 folder."""
    from dataclasses import replace

    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from typer.testing import CliRunner

    from edge.commands import app
    from edge.families.wan import scale as scaled_wan

    like = scaled_wan.LIKE["wan2.2-ti2v-5b"]
    with torch.device("meta"):
        transformer = WanTransformer3DModel(**like.transformer)
        vae = AutoencoderKLWan(**like.vae)
    assert round(sum(p.numel() for p in transformer.parameters()) / 1e9, 2) == 5.00
    assert round(sum(p.numel() for p in vae.parameters()) / 1e6) == 705
    small = replace(like, transformer=like.transformer | {
        "num_attention_heads": 2, "attention_head_dim": 12, "ffn_dim": 32, "num_layers": 2,
        "text_dim": 64, "freq_dim": 16}, text_encoder=scaled_wan.UMT5_SMALL | {
        "d_model": 64, "d_ff": 64}, vae=like.vae | {"base_dim": 8, "decoder_base_dim": 12})
    monkeypatch.setitem(scaled_wan.LIKE, "wan2.2-ti2v-5b", small)
    out = tmp_path / "wan22"
    res = CliRunner().invoke(app, ["scale-model", "--like", "wan2.2-ti2v-5b", str(out)])
    assert res.exit_code == 0, res.output
    model = load_model(out, **SIZE)
    assert model.pipe.config.expand_timesteps and model.pipe.vae.config.is_residual
    assert model.latent_shape == (48, 3, 2, 4)
