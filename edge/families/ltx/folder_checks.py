"""What an LTX-Video folder must hold, checked before anything loads: its scheduler as edge's
sampler, the components' configs (`LTXShapes`), the video sizes it takes, a timestep-conditioned
decoder's settings (`DecodeSettings`), and the pipeline loaded from local files."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from edge.core.sampler import SamplerSettings
from edge.core.schedulers import ltx_mu
from edge.families import FamilyError
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


# LTXPipeline.__call__'s defaults
GUIDANCE = 3.0
STEPS = 50
TEXT_TOKENS = 128          # max_sequence_length
FRAME_RATE = 25
DEFAULT_SIZE = {"height": 512, "width": 704, "frames": 161}
DECODE_TIMESTEP = 0.0      # decode_timestep; decode_noise_scale None: the timestep's value
PIXEL_MULTIPLE = 32        # LTXPipeline.check_inputs: sides divisible by 32


# a sane bound on the transformer's tokens: 4x LTX at 768 x 512 and 257 frames
MAX_TOKENS = 4 * 33 * 24 * 16


def sampler_settings(path: Path, tokens: int) -> SamplerSettings:
    """FlowMatchEulerDiscreteScheduler as LTXPipeline drives it (edge's `ltx_flow_euler`):
    dynamic shifting with the exponential time shift, mu from the latent token count as
    LTXPipeline's calculate_shift gives it (the manifest's shift is exp(mu)), the stretch to
    `shift_terminal`. Any other scheduler or setting is refused naming the file and field."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    cfg = component_config(path.parent.parent, path.parent.name,
                           FlowMatchEulerDiscreteScheduler, path.name)
    kind = cfg.get("_class_name")
    if kind != "FlowMatchEulerDiscreteScheduler":
        raise FamilyError(f"{path}: scheduler {kind!r} is not supported for LTX-Video; edge "
                          "mirrors FlowMatchEulerDiscreteScheduler (ltx_flow_euler)")
    want = {"use_dynamic_shifting": True, "time_shift_type": "exponential",
            "invert_sigmas": False, "use_karras_sigmas": False,
            "use_exponential_sigmas": False, "use_beta_sigmas": False,
            "stochastic_sampling": False}
    for key, value in want.items():
        if cfg.get(key) != value:
            raise FamilyError(f"{path}: {key}={cfg.get(key)!r}; edge's ltx_flow_euler mirror "
                              f"supports {key}={value!r}")
    # LTXPipeline reads these with .get and its own fallbacks; component_config fills them
    # in with the class defaults, which are the same
    base_seq = int_field(cfg, "base_image_seq_len")
    max_seq = int_field(cfg, "max_image_seq_len")
    if max_seq == base_seq:
        raise FamilyError(f"{path}: base_image_seq_len = max_image_seq_len = {max_seq}: "
                          "calculate_shift divides by their difference")
    mu = ltx_mu(tokens, base_seq, max_seq, number_field(cfg, "base_shift", 0.5, path),
                number_field(cfg, "max_shift", 1.15, path))
    terminal = cfg.get("shift_terminal")
    if terminal is not None and (isinstance(terminal, bool)
                                 or not isinstance(terminal, int | float)
                                 or not 0 <= terminal < 1):
        raise FamilyError(f"{path}: shift_terminal={terminal!r}; must be a number in [0, 1) "
                          "or null")
    if not -50 < mu < 50:
        raise FamilyError(f"{path}: base_shift, max_shift, base_image_seq_len and "
                          f"max_image_seq_len give mu={mu:.4g} at {tokens} latent tokens: "
                          "no usable schedule")
    return checked_sampler(path, "exp(mu)", SamplerSettings(
        steps=STEPS, guidance=GUIDANCE, shift=math.exp(mu),
        num_train_timesteps=train_timesteps(cfg, path), scheduler="ltx_flow_euler",
        # diffusers stretches only where shift_terminal is truthy
        shift_terminal=float(terminal) if terminal else None, leap_min_steps=STEPS // 2))


@dataclass(frozen=True)
class LTXShapes:
    """What the folder's components say about the shapes they exchange."""

    latent_channels: int
    spatial: int                 # pixels per latent cell
    temporal: int                # frames per latent frame (after the first)
    heads: int
    timestep_decoder: bool       # the decoder takes the decode timestep (0.9.1+)
    decoder_channels: int        # channels of the decoder's full-resolution stage
    patch: int                   # the VAE's pixels per side of its output patch


def _bools(cfg: dict, key: str) -> list[bool]:
    value = cfg.get(key)
    if not isinstance(value, list | tuple) or not all(isinstance(v, bool) for v in value):
        raise FamilyError(f"{cfg['_path']}: {key}={value!r}; must be a list of booleans")
    return list(value)


def check_components(folder: Path) -> LTXShapes:
    """The transformer, VAE and text encoder configs agree on what they hand each other,
    and are what edge's cut computes, read from config.json alone: nothing is loaded."""
    from diffusers import AutoencoderKLLTXVideo, LTXVideoTransformer3DModel
    from transformers import T5Config

    tr = component_config(folder, "transformer", LTXVideoTransformer3DModel)
    vae = component_config(folder, "vae", AutoencoderKLLTXVideo)
    text = component_config(folder, "text_encoder", T5Config)
    for key in ("patch_size", "patch_size_t"):
        if tr.get(key) != 1:
            raise FamilyError(f"{tr['_path']}: {key}={tr.get(key)!r}; LTXPipeline runs the "
                              "transformer on one token per latent cell (1): its RoPE grid "
                              "and schedule count latent cells")
    latent = int_field(vae, "latent_channels")
    for key in ("in_channels", "out_channels"):
        if int_field(tr, key) != latent:
            raise FamilyError(f"{tr['_path']}: {key}={tr[key]}, but {vae['_path']} has "
                              f"latent_channels={latent}: the transformer must take and give "
                              "the VAE's latent channels")
    if int_field(tr, "caption_channels") != int_field(text, "d_model"):
        raise FamilyError(f"{tr['_path']}: caption_channels={tr['caption_channels']}, but "
                          f"{text['_path']} has d_model={text['d_model']}: the transformer "
                          "must take the text encoder's width")
    inner = int_field(tr, "num_attention_heads") * int_field(tr, "attention_head_dim")
    if int_field(tr, "cross_attention_dim") != inner:
        raise FamilyError(f"{tr['_path']}: cross_attention_dim={tr['cross_attention_dim']}; "
                          f"the caption projection gives the inner width {inner}")
    noise = _bools(vae, "decoder_inject_noise")
    if any(noise):
        raise FamilyError(f"{vae['_path']}: decoder_inject_noise={noise}: the decoder draws "
                          "noise inside (torch.randn from the global generator, which has no "
                          "ONNX function and which LTXPipeline does not seed); edge takes "
                          "decoders without injected noise (0.9.0, 0.9.5+)")
    patch, patch_t = int_field(vae, "patch_size"), int_field(vae, "patch_size_t")
    # the pipeline's ratios (the config's, else the encoder's scaling) must be what the
    # decoder makes, or LTXPipeline's sizes would not be the decoded video's
    ups = sum(_bools(vae, "decoder_spatio_temporal_scaling"))
    encoder_ups = sum(_bools(vae, "spatio_temporal_scaling"))
    for key, own, scale in (("spatial_compression_ratio", patch * 2 ** encoder_ups, patch),
                            ("temporal_compression_ratio", patch_t * 2 ** encoder_ups, patch_t)):
        ratio = own if vae.get(key) is None else vae[key]
        if ratio != scale * 2 ** ups:
            raise FamilyError(f"{vae['_path']}: {key} is {ratio}, but the decoder's "
                              f"decoder_spatio_temporal_scaling and patch sizes make "
                              f"{scale * 2 ** ups}")
    channels = vae.get("decoder_block_out_channels")
    factors = vae.get("upsample_factor") or [1]
    if not isinstance(channels, list | tuple) or not channels:
        raise FamilyError(f"{vae['_path']}: decoder_block_out_channels={channels!r}; must be "
                          "a list")
    timestep = vae.get("timestep_conditioning")
    if not isinstance(timestep, bool):
        raise FamilyError(f"{vae['_path']}: timestep_conditioning={timestep!r}; must be "
                          "true or false")
    spatial = patch * 2 ** ups
    return LTXShapes(latent_channels=latent, spatial=spatial, temporal=patch_t * 2 ** ups,
                     heads=int(tr["num_attention_heads"]), timestep_decoder=timestep,
                     decoder_channels=int(channels[0]) // int(factors[0]), patch=patch)


def video_multiple(shapes: LTXShapes) -> int:
    return math.lcm(PIXEL_MULTIPLE, shapes.spatial)


def latent_tokens(shapes: LTXShapes, height: int, width: int, frames: int) -> int:
    """LTXPipeline's video_sequence_length: latent frames x height x width."""
    return (((frames - 1) // shapes.temporal + 1) * (height // shapes.spatial)
            * (width // shapes.spatial))


def check_video_size(shapes: LTXShapes, height: int, width: int, frames: int,
                     frame_rate: float) -> None:
    """Sides multiples of 32 (LTXPipeline's check; and of the VAE's scale), frames = temporal
    k + 1, a positive frame rate, the tokens and the memory an export needs within bounds."""
    multiple = video_multiple(shapes)
    for name, value in (("height", height), ("width", width)):
        if value < multiple or value % multiple:
            raise FamilyError(f"--{name} {value}: LTX-Video needs a positive multiple of "
                              f"{multiple} (LTXPipeline's 32 and the VAE's {shapes.spatial})")
    if frames < 1 or (frames - 1) % shapes.temporal:
        raise FamilyError(f"--frames {frames}: LTX-Video needs {shapes.temporal}k + 1 frames "
                          f"(e.g. {2 * shapes.temporal + 1}, {20 * shapes.temporal + 1})")
    if isinstance(frame_rate, bool) or not isinstance(frame_rate, int | float) \
            or not 0 < frame_rate < math.inf:
        raise FamilyError(f"--frame-rate {frame_rate!r}: must be a positive number of frames "
                          "per second (LTXPipeline's default: 25)")
    tokens = latent_tokens(shapes, height, width, frames)
    if tokens > MAX_TOKENS:
        raise FamilyError(f"--height {height} --width {width} --frames {frames}: {tokens} "
                          f"transformer tokens, more than edge takes ({MAX_TOKENS})")
    # the widest activation: the decoder's last stage over the whole clip, about four copies
    # (input, output, norm, shortcut); the guidance batch's attention scores; the reference
    last = frames * (height // shapes.patch) * (width // shapes.patch)
    need = max(4 * last * shapes.decoder_channels * 4, 2 * shapes.heads * tokens ** 2 * 4,
               frames * height * width * 3 * 4)
    if need > physical_memory_bytes():
        raise FamilyError(f"--height {height} --width {width} --frames {frames}: an export "
                          f"at this size holds about {need / 2**30:.1f} GiB of activations, "
                          "more than this machine's memory")


@dataclass(frozen=True)
class DecodeSettings:
    """A timestep-conditioned decoder's generation settings (LTXPipeline's decode_timestep
    and decode_noise_scale; None: the timestep's value), the manifest's `decode`."""

    timestep: float = DECODE_TIMESTEP
    noise_scale: float | None = None

    def to_dict(self) -> dict:
        return {"timestep": self.timestep, "noise_scale": self.noise_scale}


def decode_settings(shapes: LTXShapes, vae_config: Path, timestep: float | None,
                    noise_scale: float | None) -> DecodeSettings | None:
    if not shapes.timestep_decoder:
        given = [n for n, v in (("--decode-timestep", timestep),
                                ("--decode-noise-scale", noise_scale)) if v is not None]
        if given:
            raise FamilyError(f"{', '.join(given)}: {vae_config} has no "
                              "timestep_conditioning, so its decoder takes no decode timestep")
        return None
    for name, value in (("--decode-timestep", timestep), ("--decode-noise-scale", noise_scale)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not 0 <= value <= 1):
            raise FamilyError(f"{name} {value!r}: must be a number in [0, 1]")
    return DecodeSettings(DECODE_TIMESTEP if timestep is None else float(timestep),
                          None if noise_scale is None else float(noise_scale))


def check_folder(folder: Path) -> dict:
    return check_component_folders(folder, COMPONENTS)


def load_pipeline(folder: Path, out_of_core: bool | None = None) -> tuple:
    """The folder's LTXPipeline in float32 from local files only, whole or out of core
    (`load_family_pipeline`); (pipeline, notes, out_of_core)."""
    from diffusers import LTXPipeline

    return load_family_pipeline(folder, LTXPipeline, out_of_core)


