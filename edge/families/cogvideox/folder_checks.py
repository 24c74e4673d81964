"""What a CogVideoX folder must hold, checked before anything loads: its scheduler as edge's
sampler, the components' configs (`CogVideoXShapes`), the video sizes it takes, and the
pipeline loaded from local files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from edge.core.sampler import SamplerSettings
from edge.families import FamilyError
from edge.families.cogvideox.networks import FRAME_BATCH
from edge.families.folder import (
    check_component_folders,
    checked_sampler,
    component_config,
    int_field,
    load_family_pipeline,
    number_field,
    physical_memory_bytes,
    train_timesteps,
)

COMPONENTS = ("text_encoder", "tokenizer", "transformer", "vae", "scheduler")
GUIDANCE = 6.0            # CogVideoXPipeline's guidance_scale
STEPS = 50


# a sane bound on the transformer's video tokens: 4x CogVideoX's own 13 x 30 x 45
MAX_TOKENS = 4 * 13 * 30 * 45


def sampler_settings(scheduler_config: Path) -> SamplerSettings:
    """CogVideoXDDIMScheduler as CogVideoX configures it (edge's `cogvideox_ddim` mirror);
    any other scheduler or setting is refused naming the file and field."""
    from diffusers import CogVideoXDDIMScheduler

    cfg = component_config(scheduler_config.parent.parent, scheduler_config.parent.name,
                           CogVideoXDDIMScheduler, "scheduler_config.json")
    kind = cfg.get("_class_name")
    if kind != "CogVideoXDDIMScheduler":
        raise FamilyError(f"{scheduler_config}: scheduler {kind!r} is not supported for "
                          "CogVideoX; edge mirrors CogVideoXDDIMScheduler (cogvideox_ddim)")
    want = {"prediction_type": "v_prediction", "beta_schedule": "scaled_linear",
            "beta_start": 0.00085, "beta_end": 0.012, "trained_betas": None,
            "clip_sample": False, "set_alpha_to_one": True, "steps_offset": 0,
            "timestep_spacing": "trailing", "rescale_betas_zero_snr": True}
    for key, value in want.items():
        if cfg.get(key) != value:
            raise FamilyError(f"{scheduler_config}: {key}={cfg.get(key)!r}; edge's "
                              f"cogvideox_ddim mirror supports {key}={value!r}")
    if cfg.get("thresholding"):
        raise FamilyError(f"{scheduler_config}: thresholding=true is not supported")
    return checked_sampler(scheduler_config, "snr_shift_scale", SamplerSettings(
        steps=STEPS, guidance=GUIDANCE,
        shift=number_field(cfg, "snr_shift_scale", 3.0, scheduler_config),
        num_train_timesteps=train_timesteps(cfg, scheduler_config),
        scheduler="cogvideox_ddim", leap_min_steps=STEPS // 2))


@dataclass(frozen=True)
class CogVideoXShapes:
    """What the folder's components say about the shapes they exchange."""

    latent_channels: int
    spatial: int                 # pixels per latent cell
    temporal: int                # frames per latent frame (after the first)
    patch: int
    text_tokens: int             # the transformer's max_text_seq_length: the prompt's length
    sample: tuple[int, int, int]  # the transformer's own height, width (pixels) and frames
    rotary: bool                 # 5B: rotary positions in attention (2B: a sin-cos table)
    inner_dim: int
    decoder_channels: int        # channels of the decoder's full-resolution stage


def check_components(folder: Path) -> CogVideoXShapes:
    """The transformer, VAE and text encoder configs agree on what they hand each other,
    read from config.json alone: nothing is loaded."""
    from diffusers import AutoencoderKLCogVideoX, CogVideoXTransformer3DModel
    from transformers import T5Config

    tr = component_config(folder, "transformer", CogVideoXTransformer3DModel)
    vae = component_config(folder, "vae", AutoencoderKLCogVideoX)
    text = component_config(folder, "text_encoder", T5Config)
    for key, why in (("patch_size_t", "CogVideoX 1.5's temporal patches"),
                     ("ofs_embed_dim", "CogVideoX 1.5's image-to-video offset embedding")):
        if tr.get(key) is not None:
            raise FamilyError(f"{tr['_path']}: {key}={tr[key]!r} ({why}) is not supported; "
                              "edge takes CogVideoX 1.0 text to video (2B, 5B)")
    if tr.get("use_learned_positional_embeddings"):
        raise FamilyError(f"{tr['_path']}: use_learned_positional_embeddings (CogVideoX-5B "
                          "image to video) is not supported; edge takes text to video")
    latent = int_field(vae, "latent_channels")
    for key in ("in_channels", "out_channels"):
        if int_field(tr, key) != latent:
            raise FamilyError(f"{tr['_path']}: {key}={tr[key]}, but {vae['_path']} has "
                              f"latent_channels={latent}: the transformer must take and give "
                              "the VAE's latent channels")
    if int_field(tr, "text_embed_dim") != int_field(text, "d_model"):
        raise FamilyError(f"{tr['_path']}: text_embed_dim={tr['text_embed_dim']}, but "
                          f"{text['_path']} has d_model={text['d_model']}: the transformer "
                          "must take the text encoder's width")
    channels = vae.get("block_out_channels")
    if not isinstance(channels, list | tuple) or not channels:
        raise FamilyError(f"{vae['_path']}: block_out_channels={channels!r}; must be a list")
    ratio = vae.get("temporal_compression_ratio")
    if ratio not in (1, 2, 4, 8):
        raise FamilyError(f"{vae['_path']}: temporal_compression_ratio={ratio!r}; must be 1, "
                          "2, 4 or 8")
    spatial = 2 ** (len(channels) - 1)
    return CogVideoXShapes(
        latent_channels=latent, spatial=spatial, temporal=int(ratio),
        patch=int_field(tr, "patch_size"), text_tokens=int_field(tr, "max_text_seq_length"),
        sample=(int_field(tr, "sample_height") * spatial, int_field(tr, "sample_width") * spatial,
                int_field(tr, "sample_frames")),
        rotary=bool(tr.get("use_rotary_positional_embeddings")),
        inner_dim=int_field(tr, "num_attention_heads") * int_field(tr, "attention_head_dim"),
        decoder_channels=int(channels[0]))


def check_video_size(shapes: CogVideoXShapes, height: int, width: int, frames: int) -> None:
    """Sides multiples of the VAE's scale times the patch, frames = temporal k + 1, the
    tokens and the memory an export needs within bounds."""
    multiple = shapes.spatial * shapes.patch
    for name, value in (("height", height), ("width", width)):
        if value < multiple or value % multiple:
            raise FamilyError(f"--{name} {value}: CogVideoX needs a positive multiple of "
                              f"{multiple} (its VAE's {shapes.spatial} x patch {shapes.patch})")
    if frames < 1 or (frames - 1) % shapes.temporal:
        raise FamilyError(f"--frames {frames}: CogVideoX needs {shapes.temporal}k + 1 frames "
                          f"(e.g. {2 * shapes.temporal + 1}, {12 * shapes.temporal + 1})")
    latent_frames = (frames - 1) // shapes.temporal + 1
    tokens = latent_frames * (height // multiple) * (width // multiple)
    if tokens > MAX_TOKENS:
        raise FamilyError(f"--height {height} --width {width} --frames {frames}: {tokens} "
                          f"transformer tokens, more than edge takes ({MAX_TOKENS})")
    # one decoder call's widest activation: its frames at full resolution, about four copies
    # (input, output, norm, caches), or the reference video
    call_frames = (FRAME_BATCH + 1) * shapes.temporal
    need = max(4 * call_frames * shapes.decoder_channels * height * width * 4,
               frames * height * width * 3 * 4)
    if need > physical_memory_bytes():
        raise FamilyError(f"--height {height} --width {width} --frames {frames}: an export "
                          f"at this size holds about {need / 2**30:.1f} GiB of activations, "
                          "more than this machine's memory")


def check_folder(folder: Path) -> dict:
    return check_component_folders(folder, COMPONENTS)


def load_pipeline(folder: Path, out_of_core: bool | None = None) -> tuple:
    """The folder's CogVideoXPipeline in float32 from local files only, whole or out of core
    (`load_family_pipeline`); (pipeline, notes, out_of_core)."""
    from diffusers import CogVideoXPipeline

    pipe, notes, out_of_core = load_family_pipeline(folder, CogVideoXPipeline, out_of_core)
    plain_convolutions(pipe.vae)
    return pipe, notes, out_of_core


def plain_convolutions(vae: nn.Module) -> None:
    """CogVideoXSafeConv3d cuts an input over 2 GB into overlapping pieces in time to spare a
    GPU's memory, which gives the same numbers as one convolution; its size test is control
    flow on the input's shape, which an export with a dynamic batch cannot trace. Each
    becomes the plain Conv3d it is (the same parameters; the reference too)."""
    from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXSafeConv3d

    for module in vae.modules():
        if isinstance(module, CogVideoXSafeConv3d):
            module.__class__ = nn.Conv3d


