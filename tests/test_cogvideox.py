"""The CogVideoX family (edge/families/cogvideox.py) against diffusers' CogVideoXPipeline, on
tiny random-weight folders (tests/cogvideox_folder.py) of both shapes: 2B's sin-cos position
table, exported at a size other than the transformer's own, and 5B's rotary positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cogvideox_folder import SAMPLE
from conftest import COG_SHAPES, FAMILY_SIZE
from tiny_parts import edited_copy, package_files

from edge.blocks import run_chain, run_chunked
from edge.families import FamilyError, load_model
from edge.pieces import piece_bounds
from edge.video_metrics import psnr, snr

# 17 frames: 5 latent frames, decoded as diffusers does in a first call of 3 and one of 2;
# 32 x 64 pixels: not the transformer's own 32 x 48, so the 2B's sin-cos table is rebuilt
SIZE = FAMILY_SIZE
SHAPES = COG_SHAPES
# cog_folders, cog_models and cog_packages: conftest.py (shared with the web and Swift tests)


def test_the_tests_export_at_a_size_other_than_the_transformers_own(cog_models):
    model = cog_models["2b"]
    assert SAMPLE["sample_width"] * 8 != SIZE["width"]
    assert model.pipe.transformer.config.use_rotary_positional_embeddings is False
    assert cog_models["5b"].pipe.transformer.config.use_rotary_positional_embeddings is True
    assert model.latent_shape == (5, 8, 4, 8)   # (F, C, h, w): frames before channels


@pytest.mark.parametrize("shape", SHAPES)
@torch.no_grad()
def test_cut_equals_diffusers(cog_models, shape):
    """Each chained component equals diffusers' own: T5 unmasked, the transformer with its
    position table at the export size (2B) or the pipeline's rotary tables (5B), the decoder
    in diffusers' calls of 3 then 2 latent frames with the caches carried."""
    model = cog_models[shape]
    pipe, cut = model.pipe, model.cut()
    ids = model._ids(["a red circle moving left", "the dog"])
    want = pipe.text_encoder(ids)[0]
    got = run_chain(cut["text_encoder"], {"input_ids": ids})["hidden"]
    assert (got - want).abs().max() <= 1e-5

    g = torch.Generator().manual_seed(3)
    latent = torch.randn(2, *model.latent_shape, generator=g)
    caption = torch.randn(2, model.text_tokens, 32, generator=g)
    t = torch.tensor([999, 421])
    want = pipe.transformer(hidden_states=latent, encoder_hidden_states=caption, timestep=t,
                            image_rotary_emb=model._rope(), return_dict=False)[0]
    got = run_chain(cut["transformer"], {"latent": latent, "t": t.float() / 1000,
                                         "caption": caption})["velocity"]
    assert got.shape == want.shape and (got - want).abs().max() <= 1e-5

    z = torch.randn(2, *model.latent_shape, generator=g)
    want = pipe.vae.decode(z.permute(0, 2, 1, 3, 4) / pipe.vae.config.scaling_factor).sample
    want = (want / 2 + 0.5).clamp(0, 1)
    got = run_chunked(cut["vae_decoder"], model.chunked["vae_decoder"], {"z": z})["frames"]
    assert got.shape == want.shape == (2, 3, 17, 32, 64)
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("frames,first", [(13, 2), (9, 3), (5, 2)])
@torch.no_grad()
def test_decoder_calls_follow_diffusers_for_each_frame_count(cog_folders, frames, first):
    """An even latent frame count decodes in calls of two from the start, an odd one's first
    call takes three; a video of a single call still gets its later-call graphs."""
    model = load_model(cog_folders["2b"], frames=frames, height=32, width=32)
    chunking = model.chunked["vae_decoder"]
    assert (chunking.first_size, chunking.size, chunking.axis, chunking.output_axis) == \
        (first, 2, 1, 2)
    z = torch.randn(1, *model.latent_shape, generator=torch.Generator().manual_seed(5))
    vae = model.pipe.vae
    want = (vae.decode(z.permute(0, 2, 1, 3, 4) / vae.config.scaling_factor).sample / 2
            + 0.5).clamp(0, 1)
    blocks = model._cut_vae_decoder(1)
    got = run_chunked(blocks, chunking, {"z": z})["frames"]
    assert got.shape == want.shape and (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("frames", [1, 2, 3, 4])
@pytest.mark.parametrize("compress_time", [True, False])
@torch.no_grad()
def test_graph_friendly_upsampler_equals_diffusers(frames, compress_time):
    """The decoder's upsampler at rank 5 at most (CoreML has no upsample_nearest3d) equals
    CogVideoXUpsample3D for an odd call (its first frame apart), an even one and one frame."""
    from diffusers.models.upsampling import CogVideoXUpsample3D

    from edge.families.cogvideox import GraphFriendlyUpsample

    theirs = CogVideoXUpsample3D(4, 4, compress_time=compress_time).eval()
    x = torch.randn(2, 4, frames, 3, 5, generator=torch.Generator().manual_seed(frames))
    assert torch.equal(GraphFriendlyUpsample(theirs)(x), theirs(x))


@pytest.mark.parametrize("frames,size", [(1, (1, 4, 6)), (3, (5, 8, 12)), (2, (8, 2, 3)),
                                         (2, (2, 2, 3))])
@torch.no_grad()
def test_graph_friendly_spatial_norm_equals_diffusers(frames, size):
    """The spatial norm's resize of the latents to the activations' size, at rank 5 at most
    (CoreML has no upsample_nearest3d), equals CogVideoXSpatialNorm3D's: an odd call's first
    frame apart, whole multiples in time and space, no resize at all."""
    from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXSpatialNorm3D

    from edge.families.cogvideox import GraphFriendlySpatialNorm

    theirs = CogVideoXSpatialNorm3D(8, 4, groups=4).eval()
    g = torch.Generator().manual_seed(frames)
    zq = torch.randn(2, 4, frames, 2, 3, generator=g)
    f = torch.randn(2, 8, *size, generator=g)
    assert torch.equal(GraphFriendlySpatialNorm(theirs)(f, zq)[0], theirs(f, zq)[0])


def test_piece_bounds():
    assert piece_bounds(5, 2, 3) == [(0, 3), (3, 5)]
    assert piece_bounds(4, 2, 2) == piece_bounds(4, 2) == [(0, 2), (2, 4)]
    assert piece_bounds(3, 1) == [(0, 1), (1, 2), (2, 3)]
    for length, first in ((4, 3), (2, 3)):
        with pytest.raises(ValueError, match=f"{length} along the chunked axis"):
            piece_bounds(length, 2, first)


@pytest.mark.parametrize("shape", SHAPES)
def test_package_reproduces_cogvideox_pipeline(cog_packages, cog_models, shape):
    """The Python runtime given diffusers' prompt, negative prompt, latents (B, F, C, h, w),
    steps and guidance makes CogVideoXPipeline's video; another noise does not."""
    from edge.runtimes.python import Pipeline

    root, manifest = cog_packages[shape]
    model = cog_models[shape]
    assert manifest["latent_shape"] == [5, 8, 4, 8] and manifest["latent_layout"] == "video"
    chunked = next(c for c in manifest["components"] if c["name"] == "vae_decoder")["chunked"]
    assert (chunked["first_size"], chunked["size"], chunked["output_axis"]) == (3, 2, 2)
    assert max(b["validation"]["max_abs_error"] for c in manifest["components"]
               for b in c["blocks"]) <= 1e-4
    latents = np.random.default_rng(7).standard_normal((1, *model.latent_shape),
                                                       dtype=np.float32)
    kwargs = {"negative_prompt": "blue dog", "latents": latents, "steps": 6, "guidance": 4.0}
    runtime = Pipeline.load(root)
    try:
        got = runtime.generate("a red circle moving left", **kwargs)
        other_noise = runtime.generate("a red circle moving left", **(kwargs | {
            "latents": np.random.default_rng(8).standard_normal(latents.shape,
                                                                dtype=np.float32)}))
    finally:
        runtime.close()
    want = model.reference("a red circle moving left", **kwargs)
    assert got.shape == want.shape == (1, SIZE["frames"], SIZE["height"], SIZE["width"], 3)
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))
    assert snr(other_noise, want) < 15.0, snr(other_noise, want)


def test_seeded_generation_is_the_pipelines(cog_packages, cog_models):
    """A seed means diffusers' noise for that generator: latents drawn (F, C, h, w)."""
    from edge.runtimes.python import Pipeline

    runtime = Pipeline.load(cog_packages["2b"][0])
    try:
        got = runtime.generate("a cat", seed=11, steps=4)
    finally:
        runtime.close()
    want = cog_models["2b"].reference("a cat", seed=11, steps=4)
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0


def test_dynamic_guidance_is_the_pipelines_use_dynamic_cfg(cog_packages, cog_models):
    """`dynamic_guidance=True` (a generation setting) makes CogVideoXPipeline's video with
    use_dynamic_cfg, which is another video than the fixed scale's."""
    from edge.runtimes.python import Pipeline

    latents = np.random.default_rng(4).standard_normal((1, *cog_models["2b"].latent_shape),
                                                       dtype=np.float32)
    kwargs = {"latents": latents, "steps": 6, "guidance": 6.0}
    runtime = Pipeline.load(cog_packages["2b"][0])
    try:
        got = runtime.generate("a red circle", dynamic_guidance=True, **kwargs)
        fixed = runtime.generate("a red circle", **kwargs)
    finally:
        runtime.close()
    want = cog_models["2b"].reference("a red circle", dynamic_guidance=True, **kwargs)
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))
    assert psnr(fixed, want) < psnr(got, want) - 10


@pytest.mark.slow  # the session's CoreML export (about 30 s) and its end-to-end check
def test_exports_to_the_iphone_and_holds_the_end_to_end_check(cog_iphone_package):
    """The decoder's graph-friendly rewrites are what CoreML takes (diffusers' group norms
    lower to rank 6, its spatial norms and upsamplers use upsample_nearest3d): every block
    of the rotary shape converts, within 1e-2 with its stored fp16 weights (absolute: the
    decoder's later stages reach 5.5e-3 on their larger activations), and CogVideoXPipeline
    with those weights stays >= 35 dB from fp32 end to end (64.6 dB). The Swift runtime
    replays bundles of this package (tests/test_swift_runtime.py)."""
    from edge.package import read_package

    root, manifest = cog_iphone_package
    assert read_package(root) == manifest
    assert max(b["validation"]["max_abs_error"] for c in manifest["components"]
               for b in c["blocks"]) <= 1e-2
    check = manifest["validation"]
    assert check["psnr_db"] >= 35 and check["snr_db"] >= 20, check


def test_leap_step_cache_and_tdtm_run_on_cogvideox(cog_packages):
    """The techniques on the rotary shape: a leap (for DDIM one jump to the clean sample its
    v-prediction gives), the step cache skipping transformer calls (block 0's modulation
    from the prologue), TDTM's merged blocks for the first steps; each another video."""
    from edge.runtimes.python import Pipeline

    runtime = Pipeline.load(cog_packages["5b"][0])
    try:
        base = runtime.generate("a cat", steps=12)
        runs = {}
        for name, options in {"leap": {"leap": True, "leap_after": 6},
                              "cache": {"cache_threshold": 0.3},
                              "tdtm": {"merge_steps": 4}}.items():
            runs[name] = (runtime.generate("a cat", steps=12, **options),
                          runtime.last_run["sampler"])
        with pytest.raises(ValueError, match="cogvideox_ddim leaps in one step only"):
            runtime.generate("a cat", steps=12, leap=True, leap_after=6, leap_steps=3)
    finally:
        runtime.close()
    assert runs["leap"][1]["leap_at"] == 6 and runs["leap"][1]["calls"] == 7
    assert runs["cache"][1]["transformer_calls"] < 12
    assert runs["tdtm"][1]["merged_calls"] == 4
    for video, _ in runs.values():
        assert video.shape == base.shape and not np.array_equal(video, base)


def test_streamed_under_a_budget_equals_resident(cog_packages):
    """At the largest block's budget the loader streams every block, the decoder's calls
    included, and makes the resident runtime's video."""
    from edge.runtimes.python import Pipeline

    root, manifest = cog_packages["2b"]
    largest = max(f["bytes"] for c in manifest["components"] for b in c["blocks"]
                  for f in b["files"] if f["path"] == b["weights"]["path"])
    resident, streamed = Pipeline.load(root), Pipeline.load(root, memory_budget=largest)
    try:
        want = resident.generate("a red dog", steps=4)
        got = streamed.generate("a red dog", steps=4)
        assert streamed.last_run["bytes_read"] > resident.last_run["bytes_read"]
        assert streamed.last_run["peak_held_bytes"] <= largest
    finally:
        resident.close()
        streamed.close()
    np.testing.assert_array_equal(got, want)


@torch.no_grad()
def test_merged_block_equals_the_block_when_frame_pairs_are_equal(cog_models):
    """TDTM's variant of a block, fed video tokens whose frames are equal in pairs (the
    last, odd frame alone), gives the block's own output: merging then loses nothing (the
    merged keys' log 2 keeps the caption's share of the joint attention)."""
    from edge.families.cogvideox import CogVideoXBlockCut, MergedCogVideoXBlock

    model = cog_models["5b"]
    block = model.pipe.transformer.transformer_blocks[0]
    frames, (_, _, h, w) = model.latent_shape[0], model.latent_shape
    g = torch.Generator().manual_seed(2)
    per_frame = h * w // 4
    pairs = torch.randn(1, (frames + 1) // 2, per_frame, 32, generator=g)
    x = pairs.repeat_interleave(2, dim=1)[:, :frames].flatten(1, 2)
    context = torch.randn(1, model.text_tokens, 32, generator=g)
    temb = torch.randn(1, 16, generator=g)
    cos, sin = (torch.ones(frames * per_frame, 16), torch.zeros(frames * per_frame, 16))
    want = CogVideoXBlockCut(block)(x, context, temb, cos, sin)
    got = MergedCogVideoXBlock(block, frames, model.text_tokens, per_frame)(
        x, context, temb, cos, sin)
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max() <= 1e-5


# ---- what the family refuses, before any work ------------------------------------------------

@pytest.mark.parametrize("component,filename,changes,message", [
    ("scheduler", "scheduler_config.json", {"_class_name": "CogVideoXDPMScheduler"},
     r"scheduler_config.json: scheduler 'CogVideoXDPMScheduler' is not supported"),
    ("scheduler", "scheduler_config.json", {"clip_sample": True},
     r"scheduler_config.json: clip_sample=True; .* supports clip_sample=False"),
    ("scheduler", "scheduler_config.json", {"prediction_type": "epsilon"},
     r"prediction_type='epsilon'"),
    ("transformer", "config.json", {"in_channels": 4},
     r"transformer/config.json: in_channels=4, but .*vae/config.json has latent_channels=8"),
    ("transformer", "config.json", {"text_embed_dim": 48},
     r"text_embed_dim=48, but .*text_encoder/config.json has d_model=32"),
    ("transformer", "config.json", {"patch_size_t": 2},
     r"patch_size_t=2 \(CogVideoX 1.5's temporal patches\) is not supported"),
])
def test_folders_edge_cannot_take_are_refused_by_file_and_field(cog_folders, tmp_path,
                                                               component, filename, changes,
                                                               message):
    folder = edited_copy(cog_folders["2b"], tmp_path / "edited", f"{component}/{filename}",
                         **changes)
    with pytest.raises(FamilyError, match=message):
        load_model(folder, **SIZE)


@pytest.mark.parametrize("size,message", [({"height": 40}, "--height 40: .*multiple of 16"),
                                          ({"frames": 8}, "--frames 8: .*4k \\+ 1")])
def test_sizes_cogvideox_cannot_take_are_refused(cog_folders, size, message):
    with pytest.raises(FamilyError, match=message):
        load_model(cog_folders["2b"], **(SIZE | size))


def test_cli_refuses_a_target_not_built_and_writes_nothing(cog_folders, tmp_path,
                                                           monkeypatch):
    """Every family exports to every target now; a family without one (as a new family
    may start) is refused by name before any work."""
    from typer.testing import CliRunner

    from edge import families
    from edge.commands import app

    monkeypatch.setitem(families.TARGETS_BY_FAMILY, "cogvideox", ("onnx",))
    out = tmp_path / "pkg"
    res = CliRunner().invoke(app, ["export", "--model", str(cog_folders["2b"]), "--target",
                                   "web", "-o", str(out)])
    assert res.exit_code != 0 and "--target web is not built for cogvideox" in res.output
    assert not out.exists()


def test_out_of_core_export_writes_the_in_memory_package(cog_folders, cog_packages, tmp_path):
    """Built on the meta device, each block's weights read from the folder as it is exported
    (edge/lazy_weights.py; tests/test_out_of_core.py): the same files, byte for byte."""
    from edge.exporters.onnx import export_onnx

    model = load_model(cog_folders["5b"], steps=6, out_of_core=True, **SIZE)
    assert model.out_of_core and all(p.is_meta for p in model.pipe.transformer.parameters())
    manifest = export_onnx(model, tmp_path / "pkg")
    assert package_files(manifest) == package_files(cog_packages["5b"][1])
