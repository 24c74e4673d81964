"""The CogVideoX family (edge/families/cogvideox/family.py) against diffusers' CogVideoXPipeline, on
tiny random-weight folders (tests/cogvideox_folder.py) of both shapes: 2B's sin-cos position
table, exported at a size other than the transformer's own, and 5B's rotary positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cogvideox_folder import SAMPLE
from conftest import COG_SHAPES, FAMILY_SIZE, chunked_attention_for_tests
from tiny_parts import edited_copy, package_files

from edge.core.pieces import piece_bounds
from edge.core.video_metrics import psnr, snr
from edge.families import FamilyError, load_model
from edge.graph.blocks import run_chain, run_chunked

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

    from edge.families.cogvideox.networks import GraphFriendlyUpsample

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

    from edge.families.cogvideox.networks import GraphFriendlySpatialNorm

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


def test_packages_decode_in_diffusers_calls(cog_packages):
    """The package's latents are (F, C, h, w), decoded in diffusers' calls of 3 then 2 latent
    frames. That it reproduces CogVideoXPipeline: the family contract
    (tests/test_family_contract.py)."""
    for _, manifest in cog_packages.values():
        assert manifest["latent_shape"] == [5, 8, 4, 8] and manifest["latent_layout"] == "video"
        chunked = next(c for c in manifest["components"]
                       if c["name"] == "vae_decoder")["chunked"]
        assert (chunked["first_size"], chunked["size"], chunked["output_axis"]) == (3, 2, 2)


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


def test_a_ddim_leap_is_one_jump(cog_packages):
    """A leap under DDIM is one jump to the clean sample its v-prediction gives: a
    re-planned tail is refused (the leap itself, the step cache and TDTM: the family
    contract)."""
    from edge.runtimes.python import Pipeline

    runtime = Pipeline.load(cog_packages["5b"][0])
    try:
        with pytest.raises(ValueError, match="cogvideox_ddim leaps in one step only"):
            runtime.generate("a cat", steps=12, leap=True, leap_after=6, leap_steps=3)
    finally:
        runtime.close()


@torch.no_grad()
def test_merged_block_equals_the_block_when_frame_pairs_are_equal(cog_models):
    """TDTM's variant of a block, fed video tokens whose frames are equal in pairs (the
    last, odd frame alone), gives the block's own output: merging then loses nothing (the
    merged keys' log 2 keeps the caption's share of the joint attention)."""
    from edge.families.cogvideox.networks import CogVideoXBlockCut, MergedCogVideoXBlock

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


def test_out_of_core_export_writes_the_in_memory_package(cog_folders, cog_packages, tmp_path):
    """Built on the meta device, each block's weights read from the folder as it is exported
    (edge/graph/lazy_weights.py; tests/test_out_of_core.py): the same files, byte for byte."""
    from edge.exporters.onnx.package import export_onnx

    model = load_model(cog_folders["5b"], steps=6, out_of_core=True, **SIZE)
    assert model.out_of_core and all(p.is_meta for p in model.pipe.transformer.parameters())
    with chunked_attention_for_tests():  # as the shared packages were
        manifest = export_onnx(model, tmp_path / "pkg")
    assert package_files(manifest) == package_files(cog_packages["5b"][1])
