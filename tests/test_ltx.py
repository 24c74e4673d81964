"""The LTX-Video family (edge/families/ltx.py) against diffusers' LTXPipeline, on tiny
random-weight folders (tests/ltx_folder.py) with both decoders: 0.9.0's plain one and a
timestep-conditioned one (0.9.5's shape), whose decode noise the runtime draws as the
pipeline does."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from ltx_folder import LATENT_CHANNELS, SCHEDULER, make_ltx_folder

from edge.blocks import run_chain
from edge.families import FamilyError, load_model
from edge.video_metrics import psnr, snr

# 17 frames: 5 latent frames (the tiny VAE is 4x in time, 8x in space)
SIZE = {"height": 32, "width": 64, "frames": 17}
LATENT_SHAPE = (LATENT_CHANNELS, 5, 4, 8)
KINDS = ("plain", "timestep")
# the timestep-conditioned package: a frame rate other than LTXPipeline's 25, and the decode
# settings LTX's examples use for 0.9.1+ as its defaults
OPTIONS = {"plain": {}, "timestep": {"frame_rate": 24, "decode_timestep": 0.05,
                                     "decode_noise_scale": 0.025}}
PROMPT = "a red circle moving left"


@pytest.fixture(scope="module")
def ltx_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ltx")
    return {k: make_ltx_folder(root / k, timestep_decoder=k == "timestep") for k in KINDS}


@pytest.fixture(scope="module")
def ltx_models(ltx_folders):
    return {k: load_model(f, steps=4, **SIZE, **OPTIONS[k]) for k, f in ltx_folders.items()}


@pytest.fixture(scope="module")
def ltx_packages(tmp_path_factory, ltx_models):
    """Both decoders' packages exported to ONNX once: {kind: (root, manifest)}."""
    from exporters.onnx import export_onnx

    root = tmp_path_factory.mktemp("ltx-onnx")
    return {k: (root / k, export_onnx(m, root / k)) for k, m in ltx_models.items()}


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
    assert max(b["validation"]["max_abs_error"] for m in (plain, timestep)
               for c in m["components"] for b in c["blocks"]) <= 1e-4


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
    assert (got - want).abs().max() <= 1e-5


def test_rope_follows_the_frame_rate(ltx_models):
    """The temporal positions are scaled by 8 / frame_rate (LTXPipeline's
    rope_interpolation_scale): another rate, other tables; the spatial ones stay."""
    at_24, at_25 = ltx_models["timestep"].rope()[0], ltx_models["plain"].rope()[0]
    assert at_24.shape == at_25.shape == (5 * 4 * 8, 32)
    assert not torch.equal(at_24, at_25)


def _run(root, *calls: dict) -> list[np.ndarray]:
    from runtimes.python import Pipeline

    runtime = Pipeline.load(root)
    try:
        return [runtime.generate(PROMPT, **kwargs) for kwargs in calls]
    finally:
        runtime.close()


@pytest.mark.parametrize("kind", KINDS)
def test_package_reproduces_ltx_pipeline(ltx_packages, ltx_models, kind):
    """The Python runtime given diffusers' prompt, negative prompt, unpacked latents, steps,
    guidance (and, for the conditioned decoder, the decode noise LTXPipeline draws from its
    generator) makes LTXPipeline's video; another noise does not."""
    model = ltx_models[kind]
    kwargs = {"negative_prompt": "blue dog", "steps": 4, "guidance": 4.0}
    runtime_kwargs = kwargs | {"latents": _latents(7)}
    reference_kwargs = kwargs | {"latents": _latents(7)}
    if kind == "timestep":  # given latents: the generator draws the decode noise first
        reference_kwargs["seed"] = 5
        runtime_kwargs["decode_noise"] = torch.randn(
            (1, *LATENT_SHAPE), generator=torch.Generator().manual_seed(5)).numpy()
    got, other = _run(ltx_packages[kind][0], runtime_kwargs,
                      runtime_kwargs | {"latents": _latents(8)})
    want = model.reference(PROMPT, **reference_kwargs)
    assert got.shape == want.shape == (1, SIZE["frames"], SIZE["height"], SIZE["width"], 3)
    assert psnr(got, want) >= 40.0 and snr(got, want) >= 25.0, (psnr(got, want),
                                                                snr(got, want))
    assert snr(other, want) < 15.0, snr(other, want)
    print(f"{kind}: PSNR {psnr(got, want):.1f} dB, SNR {snr(got, want):.1f} dB; "
          f"another noise: SNR {snr(other, want):.1f} dB")


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
    """edge.noise draws what torch.randn draws from one generator call after call (the
    decode noise after the initial latents), sizes not a multiple of 16 included."""
    from edge.noise import torch_randn_draws

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
    from runtimes.python import Pipeline

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

    from edge.package import PackageError
    from runtimes.python import Pipeline

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


def test_leap_step_cache_and_tdtm_run_on_ltx(ltx_packages):
    """The techniques on the plain package: a leap into a re-planned ltx_flow_euler tail, the
    step cache skipping transformer calls (AdaLN-single's modulation from the prologue),
    TDTM's merged blocks for the first steps; each another video."""
    from runtimes.python import Pipeline

    runtime = Pipeline.load(ltx_packages["plain"][0])
    try:
        base = runtime.generate("a cat", steps=10)
        runs = {}
        for name, options in {"leap": {"leap": True, "leap_after": 4, "leap_steps": 2},
                              "cache": {"cache_threshold": 0.3},
                              "tdtm": {"merge_steps": 4}}.items():
            runs[name] = (runtime.generate("a cat", steps=10, **options),
                          runtime.last_run["sampler"])
    finally:
        runtime.close()
    assert runs["leap"][1]["leap_at"] == 4 and runs["leap"][1]["calls"] == 6
    assert runs["cache"][1]["transformer_calls"] < 10
    assert runs["tdtm"][1]["merged_calls"] == 4
    for video, _ in runs.values():
        assert video.shape == base.shape and not np.array_equal(video, base)


@torch.no_grad()
def test_merged_block_equals_the_block_when_frame_pairs_are_equal(ltx_folders):
    """With each pair of latent frames equal (tokens and RoPE), merging loses nothing: the
    TDTM variant gives the base block's output. An even count of latent frames (13 frames:
    4), so that no frame stands alone: its keys would weigh half a pair's in the merged
    attention."""
    from edge.families.ltx import LTXBlockCut, MergedLTXBlock

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


def test_streamed_under_a_budget_equals_resident(ltx_packages):
    """The timestep-conditioned package streamed at its largest block's size gives the
    resident video, the decode inputs fed through the loader's schedule as well."""
    from runtimes.python import Pipeline

    root, manifest = ltx_packages["timestep"]
    largest = max(f["bytes"] for c in manifest["components"] for b in c["blocks"]
                  for f in b["files"] if f["path"] == b["weights"]["path"])
    resident, streamed = Pipeline.load(root), Pipeline.load(root, memory_budget=largest)
    try:
        want = resident.generate("a red dog", seed=3, steps=3)
        got = streamed.generate("a red dog", seed=3, steps=3)
        assert streamed.last_run["bytes_read"] > resident.last_run["bytes_read"]
        assert streamed.last_run["peak_held_bytes"] <= largest
    finally:
        resident.close()
        streamed.close()
    np.testing.assert_array_equal(got, want)


# ---- what the family refuses, before any work ------------------------------------------------

def _edited(folder, tmp_path, component, filename, **changes):
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    path = copy / component / filename
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))
    return copy


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
    folder = _edited(ltx_folders["plain"], tmp_path, component, filename, **changes)
    with pytest.raises(FamilyError, match=message):
        load_model(folder, **SIZE)


@pytest.mark.parametrize("options,message", [
    ({"height": 48}, "--height 48: .*multiple of 32"),
    ({"width": 40}, "--width 40: .*multiple of 32"),
    ({"frames": 16}, "--frames 16: .*4k \\+ 1"),
    ({"frame_rate": 0}, "frame_rate 0: must be a positive number"),
    ({"decode_timestep": 0.05}, "decode_timestep: .*vae/config.json has no "
                                "timestep_conditioning"),
])
def test_options_ltx_cannot_take_are_refused(ltx_folders, options, message):
    with pytest.raises(FamilyError, match=message):
        load_model(ltx_folders["plain"], **(SIZE | options))


def test_cli_refuses_a_target_not_built_and_writes_nothing(ltx_folders, tmp_path):
    from typer.testing import CliRunner

    from edge.cli import app

    out = tmp_path / "pkg"
    res = CliRunner().invoke(app, ["export", "--model", str(ltx_folders["plain"]), "--target",
                                   "web", "-o", str(out)])
    assert res.exit_code != 0 and "--target web is not built for ltx" in res.output
    assert not out.exists()
