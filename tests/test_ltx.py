"""The LTX-Video family (edge/families/ltx/family.py) against diffusers' LTXPipeline, on tiny
random-weight folders (tests/ltx_folder.py) with both decoders: 0.9.0's plain one and a
timestep-conditioned one (0.9.5's shape), whose decode noise the runtime draws as the
pipeline does; the decoder's graph-friendly rewrites for CoreML against diffusers' modules,
the iPhone export, and the CLI's LTX export options."""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest
import torch
from conftest import FAMILY_SIZE, LTX_KINDS, LTX_OPTIONS, chunked_attention_for_tests
from ltx_folder import (
    LATENT_CHANNELS,
    PLAIN_DECODER,
    SCHEDULER,
    TIMESTEP_DECODER,
    VAE_COMMON,
)
from tiny_parts import edited_copy, package_files

from edge.core.video_metrics import psnr, snr
from edge.families import FamilyError, load_model
from edge.graph.blocks import run_chain

# 17 frames: 5 latent frames (the tiny VAE is 4x in time, 8x in space)
SIZE = FAMILY_SIZE
LATENT_SHAPE = (LATENT_CHANNELS, 5, 4, 8)
KINDS = LTX_KINDS
OPTIONS = LTX_OPTIONS
PROMPT = "a red circle moving left"
# ltx_folders, ltx_models and ltx_packages: conftest.py (shared with the web and Swift tests)


def _latents(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, *LATENT_SHAPE), dtype=np.float32)


def test_latents_sampler_and_manifest_fields(ltx_models, ltx_packages):
    """Unpacked latents (C, F, h, w); the schedule's shift is exp(mu) of LTXPipeline's
    calculate_shift at this size's 160 latent tokens; the decode settings only where the
    decoder takes a timestep."""
    from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift

    model = ltx_models["plain"]
    assert model.latent_shape == LATENT_SHAPE
    mu = calculate_shift(5 * 4 * 8, SCHEDULER["base_image_seq_len"],
                         SCHEDULER["max_image_seq_len"], SCHEDULER["base_shift"],
                         SCHEDULER["max_shift"])
    assert model.sampler.shift == math.exp(mu)
    assert (model.sampler.scheduler, model.sampler.shift_terminal, model.sampler.guidance) == \
        ("ltx_flow_euler", 0.1, 3.0)
    plain, timestep = (ltx_packages[k][1] for k in KINDS)
    assert plain["latent_layout"] == "video" and plain["latent_shape"] == list(LATENT_SHAPE)
    assert plain["tokenizer"]["max_tokens"] == 128 and "decode" not in plain
    assert timestep["decode"] == {"timestep": 0.05, "noise_scale": 0.025}
    assert timestep["video"]["frame_rate"] == 24


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_cut_equals_diffusers(ltx_models, kind):
    """Each chained component equals diffusers' own: T5 unmasked; the transformer on packed
    latents with the prompt mask and the RoPE of this frame rate; the decoder over the whole
    clip after LTXPipeline's denormalisation (and decode noise mix)."""
    model = ltx_models[kind]
    pipe, cut = model.pipe, model.cut()
    tokens = model._tokens(["a red circle moving left", "the dog"])
    want = pipe.text_encoder(tokens.input_ids)[0]
    got = run_chain(cut["text_encoder"], {"input_ids": tokens.input_ids})["hidden"]
    assert (got - want).abs().max() <= 1e-5

    g = torch.Generator().manual_seed(3)
    latent = torch.randn(2, *model.latent_shape, generator=g)
    caption = torch.randn(2, model.text_tokens, 32, generator=g)
    t = torch.tensor([0.93, 0.41])
    _, f, h, w = model.latent_shape
    want = pipe.transformer(
        hidden_states=pipe._pack_latents(latent), encoder_hidden_states=caption,
        timestep=t * 1000, encoder_attention_mask=tokens.attention_mask.bool(), num_frames=f,
        height=h, width=w, rope_interpolation_scale=(4 / model.frame_rate, 8, 8),
        return_dict=False)[0]
    got = run_chain(cut["transformer"], {"latent": latent, "t": t, "caption": caption,
                                         "caption_mask": tokens.attention_mask})["velocity"]
    assert got.shape == (2, *LATENT_SHAPE)
    assert (got - pipe._unpack_latents(want, f, h, w)).abs().max() <= 1e-5

    vae = pipe.vae
    z = torch.randn(2, *model.latent_shape, generator=g)
    want_z = pipe._denormalize_latents(z, vae.latents_mean, vae.latents_std,
                                       vae.config.scaling_factor)
    feeds, timestep = {"z": z}, None
    if kind == "timestep":
        noise = torch.randn(2, *model.latent_shape, generator=g)
        scale, timestep = torch.tensor([0.025, 0.3]), torch.tensor([0.05, 0.5])
        want_z = (1 - scale.view(-1, 1, 1, 1, 1)) * want_z + scale.view(-1, 1, 1, 1, 1) * noise
        feeds |= {"decode_t": timestep, "decode_noise": noise, "decode_noise_scale": scale}
    want = (vae.decode(want_z, timestep).sample / 2 + 0.5).clamp(0, 1)
    got = run_chain(cut["vae_decoder"], feeds)["frames"]
    assert got.shape == want.shape == (2, 3, 17, 32, 64)
    assert torch.equal(got, want)  # the graph-friendly stages compute diffusers' numbers


# ---- the decoder written for CoreML, against diffusers' modules -------------------------------

def _decoder(kind: str, **changes) -> torch.nn.Module:
    """A tiny LTXVideoDecoder3d of the test folders' shapes (`changes`: its config's)."""
    from diffusers import AutoencoderKLLTXVideo

    torch.manual_seed(0)
    own = PLAIN_DECODER if kind == "plain" else TIMESTEP_DECODER
    return AutoencoderKLLTXVideo(**(VAE_COMMON | own | changes)).decoder.eval()


@pytest.mark.parametrize("frames", [1, 4])
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("causal", [True, False])
@torch.no_grad()
def test_graph_friendly_causal_conv_equals_diffusers(causal, kernel, frames):
    """Time padding joined by torch.cat (CoreML has no `concatenate`), none for a one-frame
    kernel (CoreML refuses a repeat of 0), on a permuted input too (a LayerNorm's output)."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoCausalConv3d

    from edge.families.ltx.networks import GraphFriendlyCausalConv3d

    theirs = LTXVideoCausalConv3d(4, 6, kernel_size=kernel, is_causal=causal).eval()
    g = torch.Generator().manual_seed(frames)
    x = torch.randn(2, frames, 3, 5, 4, generator=g).movedim(-1, 1)
    assert torch.equal(GraphFriendlyCausalConv3d(theirs)(x), theirs(x))


@pytest.mark.parametrize("channels", [8, 128, 512])
@torch.no_grad()
def test_channel_rms_norm_equals_diffusers_norm_of_moved_channels(channels):
    """The decoder's RMS norms over the channels where they stand: the same reduction over
    the same memory as diffusers' norm of the channels moved last, without its two
    transposes of the widest activations."""
    from diffusers.models.normalization import RMSNorm

    from edge.families.ltx.networks import channel_rms_norm

    norm = RMSNorm(channels, eps=1e-8, elementwise_affine=False)
    x = torch.randn(2, channels, 3, 6, 10, generator=torch.Generator().manual_seed(channels))
    assert torch.equal(channel_rms_norm(x, 1e-8), norm(x.movedim(1, -1)).movedim(-1, 1))


@pytest.mark.parametrize("channels_in,channels_out,timestep", [(8, 8, False), (8, 16, False),
                                                               (8, 8, True)])
@torch.no_grad()
def test_graph_friendly_resnet_equals_diffusers(channels_in, channels_out, timestep):
    """Norms over the channels, the shortcut's LayerNorm and convolution where the channels
    change, the time modulation at rank 5 (diffusers': rank 6, past CoreML's 5)."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoResnetBlock3d

    from edge.families.ltx.networks import GraphFriendlyResnet

    torch.manual_seed(1)
    theirs = LTXVideoResnetBlock3d(channels_in, channels_out, is_causal=False,
                                   timestep_conditioning=timestep).eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, channels_in, 3, 4, 6, generator=g)
    temb = torch.randn(2, 4 * channels_in, generator=g) if timestep else None
    # diffusers' blocks hand their resnets the embedding with the frame axes already there
    want = theirs(x, None if temb is None else temb[..., None, None, None])
    assert torch.equal(GraphFriendlyResnet(theirs)(x, temb), want)


@pytest.mark.parametrize("frames", [1, 3])
@pytest.mark.parametrize("residual,upscale", [(False, 1), (True, 1), (True, 2)])
@torch.no_grad()
def test_graph_friendly_upsampler_equals_diffusers(residual, upscale, frames):
    """The depth to space in 3D at rank 5 (diffusers reshapes to rank 8), the first frame's
    copies dropped; 0.9.5's residual upsamplers that halve the channels too."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoUpsampler3d

    from edge.families.ltx.networks import GraphFriendlyUpsampler

    torch.manual_seed(3)
    theirs = LTXVideoUpsampler3d(16, stride=(2, 2, 2), is_causal=False, residual=residual,
                                 upscale_factor=upscale).eval()
    x = torch.randn(2, 16, frames, 3, 5, generator=torch.Generator().manual_seed(frames))
    assert torch.equal(GraphFriendlyUpsampler(theirs)(x), theirs(x))


@pytest.mark.parametrize("kind,changes", [("plain", {}), ("plain", {"patch_size": 4}),
                                          ("timestep", {})])
@torch.no_grad()
def test_graph_friendly_decoder_equals_diffusers(kind, changes):
    """conv_in, the mid block, the up blocks and the output stage (norm, time modulation,
    the patches back to pixels at rank 5: diffusers' unpatchify reshapes to rank 8) chained
    give LTXVideoDecoder3d's frames, 2x2 and 4x4 patches."""
    from edge.families.ltx.networks import (
        GraphFriendlyCausalConv3d,
        GraphFriendlyMidBlock,
        GraphFriendlyUpBlock,
        LTXDecoderOut,
    )

    dec = _decoder(kind, **changes)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, LATENT_CHANNELS, 3, 2, 3, generator=g)
    t = torch.tensor([0.05, 0.7]) if kind == "timestep" else None
    temb = None if t is None else t * dec.timestep_scale_multiplier
    h = GraphFriendlyMidBlock(dec.mid_block)(GraphFriendlyCausalConv3d(dec.conv_in)(x), temb)
    for up in dec.up_blocks:
        h = GraphFriendlyUpBlock(up)(h, temb)
    got = LTXDecoderOut(dec)(h, temb)
    assert torch.equal(got, (dec(x, t) / 2 + 0.5).clamp(0, 1))


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_decoder_stages_hold_the_pipelines_parameters_and_leave_it_unchanged(ltx_models, kind):
    """Every decoder stage's parameter is the pipeline's own object under diffusers' name
    (the denormalisation's buffers apart: reshaped copies); cutting and running the stages
    changes no module of the pipeline."""
    vae = ltx_models[kind].pipe.vae
    classes = [type(m) for m in vae.modules()]
    state = {k: v.clone() for k, v in vae.state_dict().items()}
    theirs = dict(vae.decoder.named_parameters())
    blocks = ltx_models[kind].cut()["vae_decoder"]
    run_chain(blocks, dict(zip(blocks[0].inputs, blocks[0].example, strict=True)))
    for block in blocks:  # an up stage is one of the decoder's up_blocks
        prefix = f"up_blocks.{block.name[3:]}." if block.name.startswith("up_") else ""
        for name, p in block.module.named_parameters():
            if name not in ("latents_mean", "latents_std"):
                assert theirs[prefix + name] is p, (block.key, name)
    assert [type(m) for m in vae.modules()] == classes
    assert all(torch.equal(v, state[k]) for k, v in vae.state_dict().items())


def test_rope_follows_the_frame_rate(ltx_models):
    """The temporal positions are scaled by 8 / frame_rate (LTXPipeline's
    rope_interpolation_scale): another rate, other tables; the spatial ones stay."""
    at_24, at_25 = ltx_models["timestep"].rope()[0], ltx_models["plain"].rope()[0]
    assert at_24.shape == at_25.shape == (5 * 4 * 8, 32)
    assert not torch.equal(at_24, at_25)


def _run(root, *calls: dict) -> list[np.ndarray]:
    from edge.runtimes.python import Pipeline

    runtime = Pipeline.load(root)
    try:
        return [runtime.generate(PROMPT, **kwargs) for kwargs in calls]
    finally:
        runtime.close()


def test_guidance_rescale_is_the_pipelines(ltx_packages, ltx_models):
    """LTXPipeline's guidance_rescale as the sampler setting of that name: the guided
    velocity mixed with itself rescaled to the conditional one's spread, every step (a
    strong guidance, so the rescale moves the video)."""
    model = ltx_models["plain"]
    kwargs = {"negative_prompt": "blue dog", "steps": 4, "guidance": 9.0,
              "latents": _latents(7)}
    got, plain = _run(ltx_packages["plain"][0], kwargs | {"guidance_rescale": 0.7}, kwargs)
    want = model.reference(PROMPT, guidance_rescale=0.7, **kwargs)
    want_plain = model.reference(PROMPT, **kwargs)
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))
    assert snr(plain, want) < snr(got, want) - 15  # the rescale changes the video
    assert psnr(plain, want_plain) >= 40.0
    print(f"guidance_rescale 0.7: PSNR {psnr(got, want):.1f} dB, SNR {snr(got, want):.1f} "
          f"dB; without it against the rescaled pipeline SNR {snr(plain, want):.1f} dB")


def test_seeded_generation_is_the_pipelines(ltx_packages, ltx_models):
    """A seed means LTXPipeline's generator: the initial latents drawn (C, F, h, w), then the
    decode noise, its second draw; the decode settings may be changed per generation."""
    model = ltx_models["timestep"]
    got, changed = _run(ltx_packages["timestep"][0], {"seed": 11, "steps": 4},
                        {"seed": 11, "steps": 4, "decode_timestep": 0.4,
                         "decode_noise_scale": 0.2})
    want = model.reference(PROMPT, seed=11, steps=4)
    want_changed = model.reference(PROMPT, seed=11, steps=4, decode_timestep=0.4,
                                   decode_noise_scale=0.2)
    for video, reference in ((got, want), (changed, want_changed)):
        assert psnr(video, reference) >= 40.0 and snr(video, reference) >= 25.0, (
            psnr(video, reference), snr(video, reference))
    assert snr(changed, want) < 25.0  # the decode settings change the video
    print(f"seeded: PSNR {psnr(got, want):.1f} dB, SNR {snr(got, want):.1f} dB; changed "
          f"decode settings: PSNR {psnr(changed, want_changed):.1f} dB; against the "
          f"defaults' SNR {snr(changed, want):.1f} dB")


@pytest.mark.parametrize("shapes", [[LATENT_SHAPE, LATENT_SHAPE], [(17,), (33,), (5,)]])
def test_consecutive_draws_are_one_generators(shapes):
    """edge.core.noise draws what torch.randn draws from one generator call after call (the
    decode noise after the initial latents), sizes not a multiple of 16 included."""
    from edge.core.noise import torch_randn_draws

    g = torch.Generator().manual_seed(5)
    for got, shape in zip(torch_randn_draws(shapes, 5), shapes, strict=True):
        want = torch.randn(shape, generator=g).numpy()
        assert np.abs(got - want).max() <= 1e-5
    with pytest.raises(ValueError, match="only the last may hold under 16 values"):
        torch_randn_draws([(3,), (20,)], 5)


def test_decode_settings_the_runtime_refuses(ltx_packages):
    """Given latents with a decode noise scale need the noise (diffusers draws it from the
    pipeline's generator); a plain decoder takes no decode settings. Refused before any
    block runs."""
    from edge.runtimes.python import Pipeline

    for kind, calls in {
            "timestep": [({"latents": _latents(1)}, "pass decode_noise too"),
                         ({"latents": _latents(1), "decode_noise": np.zeros((1, 8))},
                          "decode_noise must be a finite NumPy array"),
                         ({"seed": 1, "decode_timestep": float("nan")},
                          "decode_timestep nan must be a finite number")],
            "plain": [({"seed": 1, "decode_timestep": 0.05}, "takes no decode timestep"),
                      ({"seed": 1, "decode_noise": np.zeros((1, *LATENT_SHAPE))},
                       "takes no decode timestep")]}.items():
        runtime = Pipeline.load(ltx_packages[kind][0])
        try:
            for kwargs, message in calls:
                with pytest.raises(ValueError, match=message):
                    runtime.generate(PROMPT, **kwargs)
                assert runtime.last_run == {}  # nothing ran
        finally:
            runtime.close()


def test_a_package_whose_decode_settings_disagree_with_its_decoder_is_refused(
        ltx_packages, tmp_path):
    """A decoder taking the decode inputs without the manifest's `decode`, or `decode`
    beside a decoder that takes none, is refused on load, naming the field."""
    from manifest_edits import rewrite

    from edge.core.package import PackageError
    from edge.runtimes.python import Pipeline

    for kind, change, message in (
            ("timestep", lambda m: m.pop("decode"), "has no 'decode' settings"),
            ("timestep", lambda m: m.update(decode={"timestep": "0.1"}),
             "decode: must be"),
            ("plain", lambda m: m.update(decode={"timestep": 0.1, "noise_scale": None}),
             "decode: needs a whole-video vae_decoder")):
        copy = tmp_path / f"{kind}-{len(message)}"
        shutil.copytree(ltx_packages[kind][0], copy)
        rewrite(copy, change)
        with pytest.raises(PackageError, match=message):
            Pipeline.load(copy)


@torch.no_grad()
def test_merged_block_equals_the_block_when_frame_pairs_are_equal(ltx_folders):
    """With each pair of latent frames equal (tokens and RoPE), merging loses nothing: the
    TDTM variant gives the base block's output. An even count of latent frames (13 frames:
    4), so that no frame stands alone: its keys would weigh half a pair's in the merged
    attention."""
    from edge.families.ltx.networks import LTXBlockCut, MergedLTXBlock

    model = load_model(ltx_folders["plain"], **(SIZE | {"frames": 13}))
    _, f, h, w = model.latent_shape
    g = torch.Generator().manual_seed(4)

    def paired(t: torch.Tensor) -> torch.Tensor:  # (..., F*h*w, D): frame 2i+1 := frame 2i
        t = t.unflatten(-2, (f, h * w)).clone()
        t[..., 1::2, :, :] = t[..., 0:f - 1:2, :, :]
        return t.flatten(-3, -2)

    cos, sin = (paired(r) for r in model.rope())
    x = paired(torch.randn(2, f * h * w, 32, generator=g))
    context = torch.randn(2, model.text_tokens, 32, generator=g)
    t_mod = torch.randn(2, 6, 32, generator=g)
    bias = torch.zeros(2, 1, 1, model.text_tokens)
    bias[0, ..., 9:] = -10000.0
    block = model.pipe.transformer.transformer_blocks[0]
    want = LTXBlockCut(block)(x, context, t_mod, bias, cos, sin)
    got = MergedLTXBlock(block, f)(x, context, t_mod, bias, cos, sin)
    assert (got - want).abs().max() <= 1e-5


# ---- the iPhone -------------------------------------------------------------------------------

@pytest.mark.slow  # the session's CoreML exports (about 20 s each) and their checks
def test_the_iphone_decoders_take_decode_inputs_where_conditioned(ltx_plain_iphone_package,
                                                                  ltx_iphone_package):
    """The plain decoder's graph-friendly stages and 0.9.5's time modulation (rank 6 written
    at rank 5) convert (every block within 5e-3 of fp32 and the end-to-end check: the family
    contract). The plain head takes z alone; the conditioned head takes decode_t,
    decode_noise and decode_noise_scale beside z, and the manifest carries `decode` (which
    the Swift runtime feeds: tests/test_swift_runtime.py replays a bundle of this package;
    its end-to-end check renders LTXPipeline with its seed's decode noise, 64.2 dB)."""
    heads = {}
    for kind, (_, manifest) in (("plain", ltx_plain_iphone_package),
                                ("timestep", ltx_iphone_package)):
        decoder = next(c for c in manifest["components"] if c["name"] == "vae_decoder")
        heads[kind] = [s["name"] for s in decoder["blocks"][0]["inputs"]]
        assert manifest["latent_layout"] == "video"
    assert "decode" not in ltx_plain_iphone_package[1] and heads["plain"] == ["z"]
    assert ltx_iphone_package[1]["decode"] == {"timestep": 0.05, "noise_scale": 0.025}
    assert heads["timestep"] == ["z", "decode_t", "decode_noise", "decode_noise_scale"]


# ---- what the family refuses, before any work ------------------------------------------------

@pytest.mark.parametrize("component,filename,changes,message", [
    ("scheduler", "scheduler_config.json", {"_class_name": "UniPCMultistepScheduler"},
     r"scheduler_config.json: scheduler 'UniPCMultistepScheduler' is not supported"),
    ("scheduler", "scheduler_config.json", {"use_dynamic_shifting": False},
     r"scheduler_config.json: use_dynamic_shifting=False; .* supports "
     r"use_dynamic_shifting=True"),
    ("scheduler", "scheduler_config.json", {"time_shift_type": "linear"},
     r"time_shift_type='linear'"),
    ("scheduler", "scheduler_config.json", {"use_karras_sigmas": True}, r"use_karras_sigmas"),
    ("scheduler", "scheduler_config.json", {"base_shift": None},
     r"scheduler_config.json: base_shift=None; must be a number"),
    ("scheduler", "scheduler_config.json", {"shift_terminal": 1.5},
     r"scheduler_config.json: shift_terminal=1.5"),
    ("transformer", "config.json", {"in_channels": 4},
     r"transformer/config.json: in_channels=4, but .*vae/config.json has latent_channels=8"),
    ("transformer", "config.json", {"caption_channels": 48},
     r"caption_channels=48, but .*text_encoder/config.json has d_model=32"),
    ("transformer", "config.json", {"patch_size": 2}, r"transformer/config.json: patch_size=2"),
    ("vae", "config.json", {"decoder_inject_noise": [False, True, True, False, False]},
     r"vae/config.json: decoder_inject_noise=\[False, True, True, False, False\]"),
])
def test_folders_edge_cannot_take_are_refused_by_file_and_field(ltx_folders, tmp_path,
                                                               component, filename, changes,
                                                               message):
    folder = edited_copy(ltx_folders["plain"], tmp_path / "edited", f"{component}/{filename}",
                         **changes)
    with pytest.raises(FamilyError, match=message):
        load_model(folder, **SIZE)


@pytest.mark.parametrize("options,message", [
    ({"frame_rate": 0}, "--frame-rate 0: must be a positive number"),
    ({"decode_timestep": 0.05}, "--decode-timestep: .*vae/config.json has no "
                                "timestep_conditioning"),
])
def test_options_ltx_cannot_take_are_refused(ltx_folders, options, message):
    with pytest.raises(FamilyError, match=message):
        load_model(ltx_folders["plain"], **(SIZE | options))


_SIZE_ARGS = ["--height", "32", "--width", "64", "--frames", "17", "--steps", "2"]
_LTX_ARGS = ["--frame-rate", "24", "--decode-timestep", "0.05", "--decode-noise-scale", "0.025"]


def test_cli_passes_ltx_options_to_the_family_only_when_given(ltx_folders, tmp_path,
                                                              monkeypatch):
    """--frame-rate, --decode-timestep and --decode-noise-scale reach LTX's load as
    frame_rate, decode_timestep and decode_noise_scale; an option not given is not passed
    (the family's default holds)."""
    from typer.testing import CliRunner

    import edge.families
    from edge.commands import app

    loaded = []

    def load_model(folder, **options):  # records what the CLI hands the family, then stops
        loaded.append(options)
        raise FamilyError("stopped after load")

    monkeypatch.setattr(edge.families, "load_model", load_model)
    out = tmp_path / "pkg"
    for folder, extra in ((ltx_folders["timestep"], _LTX_ARGS),
                          (ltx_folders["plain"], _LTX_ARGS[:2])):
        res = CliRunner().invoke(app, ["export", "--model", str(folder), "-o", str(out),
                                       *_SIZE_ARGS, *extra])
        assert "stopped after load" in res.output and not out.exists()
    size = {"height": 32, "width": 64, "frames": 17, "steps": 2}
    assert loaded == [size | {"frame_rate": 24.0, "decode_timestep": 0.05,
                              "decode_noise_scale": 0.025}, size | {"frame_rate": 24.0}]


@pytest.mark.parametrize("args,message", [
    (["--decode-timestep", "1.5"], r"--decode-timestep 1.5: must be a number in \[0, 1\]"),
    (["--frame-rate", "0"], "--frame-rate 0.0: must be a positive number"),
    (["--decode-noise-scale", "0.1"], "--decode-noise-scale: .*vae/config.json has no "
                                      "timestep_conditioning"),
])
def test_cli_ltx_options_are_checked_by_the_family(ltx_folders, tmp_path, args, message):
    from typer.testing import CliRunner

    from edge.commands import app

    folder = ltx_folders["timestep" if "1.5" in args else "plain"]
    out = tmp_path / "pkg"
    res = CliRunner().invoke(app, ["export", "--model", str(folder), "-o", str(out),
                                   *_SIZE_ARGS, *args])
    assert res.exit_code != 0 and re.search(message, res.output), res.output
    assert not out.exists()


def test_out_of_core_export_writes_the_in_memory_package(ltx_folders, ltx_packages, tmp_path):
    """Built on the meta device, each block's weights read from the folder as it is exported
    (edge/graph/lazy_weights.py; tests/test_out_of_core.py): the same files, byte for byte."""
    from edge.exporters.onnx.package import export_onnx

    model = load_model(ltx_folders["timestep"], steps=4, out_of_core=True, **SIZE,
                       **OPTIONS["timestep"])
    assert model.out_of_core and all(p.is_meta for p in model.pipe.transformer.parameters())
    with chunked_attention_for_tests():  # as the shared packages were
        manifest = export_onnx(model, tmp_path / "pkg")
    assert package_files(manifest) == package_files(ltx_packages["timestep"][1])
