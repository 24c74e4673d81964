"""What a Wan folder must hold, checked before anything loads: its scheduler as edge's sampler,
the components' configs (`WanShapes`), the video sizes it takes, the export's memory, and the
pipeline loaded from local files (in memory or out of core)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from edge.core.sampler import SamplerSettings
from edge.families import FamilyError
from edge.families.folder import (
    check_component_folders,
    checked_sampler,
    component_config,
    int_field,
    load_family_pipeline,
    number_field,
    physical_memory_bytes,
    read_json,
    train_timesteps,
)

COMPONENTS = ("text_encoder", "tokenizer", "transformer", "vae", "scheduler")
DEFAULT_SIZE = {"height": 480, "width": 832, "frames": 81}     # Wan 2.1's own defaults
TEXT_TOKENS = 512                                             # WanPipeline's max_sequence_length
GUIDANCE = 5.0
STEPS = 50


def sampler_settings(scheduler_config: Path) -> SamplerSettings:
    """The sampler the folder's scheduler describes: UniPC with flow prediction (Wan's
    default) or flow-match Euler with a static shift; anything else is refused by field."""
    cfg = read_json(scheduler_config)
    kind = cfg.get("_class_name")
    n_train = train_timesteps(cfg, scheduler_config)
    if kind == "UniPCMultistepScheduler":
        want = {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "solver_order": 2,
                "solver_type": "bh2", "predict_x0": True, "lower_order_final": True,
                "use_dynamic_shifting": False, "final_sigmas_type": "zero",
                "disable_corrector": [], "thresholding": False}
        for key, value in want.items():
            if cfg.get(key, value) != value:
                raise FamilyError(f"{scheduler_config}: {key}={cfg.get(key)!r}; edge's UniPC "
                                  f"mirror supports {key}={value!r}")
        return checked_sampler(scheduler_config, "flow_shift", SamplerSettings(
            steps=STEPS, guidance=GUIDANCE, shift=number_field(cfg, "flow_shift", 1.0,
                                                          scheduler_config),
            num_train_timesteps=n_train, scheduler="flow_unipc", leap_min_steps=STEPS // 2))
    if kind == "FlowMatchEulerDiscreteScheduler":
        for key in ("use_dynamic_shifting", "use_karras_sigmas", "use_exponential_sigmas",
                    "use_beta_sigmas", "invert_sigmas", "stochastic_sampling"):
            if cfg.get(key):
                raise FamilyError(f"{scheduler_config}: {key}=true is not supported; edge "
                                  "mirrors flow-match Euler with a static shift")
        if cfg.get("shift_terminal"):
            raise FamilyError(f"{scheduler_config}: shift_terminal is not supported")
        return checked_sampler(scheduler_config, "shift", SamplerSettings(
            steps=STEPS, guidance=GUIDANCE, shift=number_field(cfg, "shift", 1.0, scheduler_config),
            num_train_timesteps=n_train, scheduler="flow_euler", leap_min_steps=STEPS // 2))
    raise FamilyError(f"{scheduler_config}: scheduler {kind!r} is not supported for Wan; "
                      "supported: UniPCMultistepScheduler (flow_prediction), "
                      "FlowMatchEulerDiscreteScheduler")


def check_folder(folder: Path) -> dict:
    """model_index.json and every component folder a text-to-video Wan needs."""
    index = check_component_folders(folder, COMPONENTS)
    if index.get("boundary_ratio") is not None or (index.get("transformer_2") or [None])[0]:
        raise FamilyError(f"{folder / 'model_index.json'}: a second transformer (Wan 2.2 A14B's "
                          "boundary_ratio / transformer_2, one transformer for high noise and "
                          "one for low) is not supported; edge takes Wan 2.1 and Wan 2.2 "
                          "TI2V-5B")
    return index


# A sane bound on the transformer's tokens (latent frames x patches): 4x what Wan 2.1 takes at
# 720p and 81 frames (21 x 45 x 80), past which attention alone outgrows any device edge targets.
MAX_TOKENS = 4 * 21 * 45 * 80


@dataclass(frozen=True)
class WanShapes:
    """What the folder's components say about the shapes they exchange."""

    latent_channels: int        # the VAE's z_dim
    spatial: int                # pixels per latent cell (the VAE's scale_factor_spatial)
    temporal: int               # frames per latent frame (scale_factor_temporal)
    patch: tuple[int, int, int]  # the transformer's patch_size (t, h, w)
    rope_max_seq_len: int       # positions the transformer's RoPE tables hold on each axis
    ffn_dim: int
    decoder_channels: int       # channels of the VAE decoder's full-resolution stage
    decoder_patch: int | None = None  # Wan 2.2's decoder: RGB in patches of this side


def check_components(folder: Path) -> WanShapes:
    """The transformer, VAE and text encoder configs agree on what they hand each other
    (latent channels, text width), read from config.json alone: nothing is loaded."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config

    tr = component_config(folder, "transformer", WanTransformer3DModel)
    vae = component_config(folder, "vae", AutoencoderKLWan)
    text = component_config(folder, "text_encoder", UMT5Config)
    z_dim = int_field(vae, "z_dim")
    for key in ("in_channels", "out_channels"):
        if int_field(tr, key) != z_dim:
            raise FamilyError(f"{tr['_path']}: {key}={tr[key]}, but {vae['_path']} has z_dim="
                              f"{z_dim}: the transformer must take and give the VAE's latent "
                              "channels")
    for key in ("latents_mean", "latents_std"):
        if not isinstance(vae.get(key), list) or len(vae[key]) != z_dim:
            raise FamilyError(f"{vae['_path']}: {key} must list z_dim={z_dim} numbers")
    if int_field(tr, "text_dim") != int_field(text, "d_model"):
        raise FamilyError(f"{tr['_path']}: text_dim={tr['text_dim']}, but {text['_path']} has "
                          f"d_model={text['d_model']}: the transformer must take the text "
                          "encoder's width")
    patch = tr.get("patch_size")
    if (not isinstance(patch, list | tuple) or len(patch) != 3
            or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in patch)):
        raise FamilyError(f"{tr['_path']}: patch_size={patch!r}; must be 3 positive integers")
    vae_patch = vae.get("patch_size")
    if vae_patch is not None:  # Wan 2.2: the decoder gives 3 x p x p channels per pixel cell
        vae_patch = int_field(vae, "patch_size")
        if int_field(vae, "out_channels") != 3 * vae_patch ** 2:
            raise FamilyError(f"{vae['_path']}: out_channels={vae['out_channels']} with "
                              f"patch_size={vae_patch}; the decoder must give 3 x patch_size^2 "
                              f"= {3 * vae_patch ** 2} channels (RGB in patches)")
    mult = vae.get("dim_mult")
    if not isinstance(mult, list) or not mult or not all(isinstance(m, int) for m in mult):
        raise FamilyError(f"{vae['_path']}: dim_mult={mult!r}; must be a list of integers")
    base = vae.get("decoder_base_dim") or int_field(vae, "base_dim")
    return WanShapes(latent_channels=z_dim, spatial=int_field(vae, "scale_factor_spatial"),
                     temporal=int_field(vae, "scale_factor_temporal"), patch=tuple(patch),
                     rope_max_seq_len=int_field(tr, "rope_max_seq_len"),
                     ffn_dim=int_field(tr, "ffn_dim"), decoder_channels=base * mult[0],
                     decoder_patch=vae_patch)


def check_video_size(shapes: WanShapes, height: int, width: int, frames: int) -> None:
    """The sizes this model can take: frames = temporal k + 1, sides multiples of the VAE's
    scale times the patch, every axis within the RoPE tables, the tokens and the memory an
    export needs within bounds."""
    t_patch, h_patch, w_patch = shapes.patch
    for name, value, patch in (("height", height, h_patch), ("width", width, w_patch)):
        multiple = shapes.spatial * patch
        if value < multiple or value % multiple:
            raise FamilyError(f"--{name} {value}: Wan needs a positive multiple of "
                              f"{multiple} (its VAE's {shapes.spatial} x patch {patch})")
    if frames < 1 or (frames - 1) % shapes.temporal:
        raise FamilyError(f"--frames {frames}: Wan needs {shapes.temporal}k + 1 frames "
                          f"(e.g. {shapes.temporal + 1}, {4 * shapes.temporal + 1})")
    latent_frames = (frames - 1) // shapes.temporal + 1
    grid = {"--frames": (frames, -(-latent_frames // t_patch)),
            "--height": (height, height // shapes.spatial // h_patch),
            "--width": (width, width // shapes.spatial // w_patch)}
    for option, (value, positions) in grid.items():
        if positions > shapes.rope_max_seq_len:
            raise FamilyError(f"{option} {value}: {positions} positions on that axis, more "
                              f"than the transformer's RoPE tables hold (rope_max_seq_len="
                              f"{shapes.rope_max_seq_len})")
    tokens = math.prod(p for _, p in grid.values())
    if tokens > MAX_TOKENS:
        raise FamilyError(f"--height {height} --width {width} --frames {frames}: {tokens} "
                          f"transformer tokens, more than edge takes ({MAX_TOKENS})")
    need = export_memory_bytes(shapes, height, width, frames, tokens)
    have = physical_memory_bytes()
    if need > have:
        raise FamilyError(f"--height {height} --width {width} --frames {frames}: an export "
                          f"at this size holds about {need / 2**30:.1f} GiB of activations, "
                          f"more than this machine's {have / 2**30:.1f} GiB of memory")


def export_memory_bytes(shapes: WanShapes, height: int, width: int, frames: int,
                        tokens: int) -> int:
    """A floor under what an export at this size holds at once (float32): the reference
    video, one decoded latent frame at the decoder's widest stage (its input, output and
    caches: about four frames' worth) at its full-resolution stage, or the guidance batch's
    feed-forward activations."""
    video = frames * height * width * 3 * 4
    decoder = 4 * shapes.temporal * shapes.decoder_channels * height * width * 4
    transformer = 2 * tokens * shapes.ffn_dim * 4
    return max(video, decoder, transformer)


def load_pipeline(folder: Path, out_of_core: bool | None = None) -> tuple:
    """The folder's WanPipeline in float32 from local files only, whole or out of core
    (`load_family_pipeline`); (pipeline, notes, out_of_core)."""
    from diffusers import WanPipeline

    pipe, notes, out_of_core = load_family_pipeline(folder, WanPipeline, out_of_core)
    if pipe.transformer.config.added_kv_proj_dim is not None:
        raise FamilyError(f"{folder / 'transformer'}: image conditioning (added_kv_proj_dim) "
                          "is image-to-video; edge takes text-to-video Wan")
    if pipe.vae.config.patch_size is None:
        # the reference decodes a video larger than a tile as an ONNX package does
        pipe.vae.enable_tiling()
    return pipe, notes, out_of_core


