"""LTX-Video 0.9.x text to video (diffusers `LTXPipeline`): T5 v1.1 text encoder,
`LTXVideoTransformer3DModel`, `AutoencoderKLLTXVideo`, FlowMatchEulerDiscreteScheduler with
dynamic shifting, from a local diffusers pipeline folder.

Cuts (each chained component equals the diffusers component; tests/test_ltx.py):
  text_encoder  embeddings, layer_0 (gives the relative position bias), layer_1 ..
                layer_{N-1} (take it), final (edge/families/t5.py); no mask: LTXPipeline
                encodes the padded ids alone and masks the padding in the transformer
  transformer   prologue (proj_in on the packed latents, AdaLN-single time embedding, the
                caption projection, the prompt mask as a cross-attention bias, RoPE cos/sin
                for the export size and frame rate stored as weights), block_0 ..
                block_{N-1}, epilogue (norm, scale-shift, proj_out, unpacked)
  vae_decoder   head (latent denormalisation, the decode noise mix of a timestep-conditioned
                decoder, conv_in, mid block), up_0 .. up_{K-1}, out (norm, the decoder's
                own time modulation, conv_out, unpatchify, to [0, 1]); the whole clip at once

Latents are (B, C, F, h, w), unpacked, as LTXPipeline draws their noise (randn of that shape,
then packed): a seed draws what LTXPipeline draws for `torch.Generator().manual_seed(seed)`,
and latents handed to the runtime are unpacked (diffusers' `latents=` takes them packed:
`LTXPipeline._pack_latents`). With LTX's patch of 1 packing is only a transpose: the
prologue packs, the epilogue unpacks, and Euler's step is the same numbers either way.

The VAE decoder is not causal in time (each convolution pads with copies of the first and
the last frame), so it cannot be run frame by frame as Wan's: it runs over the whole clip.
Its norms are per position (RMS over channels), so the only coupling across frames and
pixels is the convolutions' reach: a windowed decode with overlaps could be exact, and is
not built yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edge.core.options import decode_values
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
from edge.families.ltx import NAME
from edge.families.pipeline_run import (
    Accepted,
    PipelineModel,
    load_family,
    with_steps,
)
from edge.families.t5 import cut_t5_encoder
from edge.graph.blocks import Block, Chunking
from edge.graph.family_model import Shapes, StorageRule
from edge.models.tdtm import merge_token_frames, pair_first_frames, unmerge_token_frames

COMPONENTS = ("text_encoder", "tokenizer", "transformer", "vae", "scheduler")
# LTXPipeline.__call__'s defaults
GUIDANCE = 3.0
STEPS = 50
TEXT_TOKENS = 128          # max_sequence_length
FRAME_RATE = 25
DEFAULT_SIZE = {"height": 512, "width": 704, "frames": 161}
DECODE_TIMESTEP = 0.0      # decode_timestep; decode_noise_scale None: the timestep's value
PIXEL_MULTIPLE = 32        # LTXPipeline.check_inputs: sides divisible by 32
CAPTION_BIAS = -10000.0    # LTXVideoTransformer3DModel's bias on masked caption tokens
# a sane bound on the transformer's tokens: 4x LTX at 768 x 512 and 257 frames
MAX_TOKENS = 4 * 33 * 24 * 16


# ---------------------------------------------------------------- loading and checks

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


# ---------------------------------------------------------------- transformer blocks

def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """LTX's rotary embedding on x (B, S, D) with tables (S, D): channel pairs rotated by
    the tables' angles."""
    real, imag = x.unflatten(-1, (-1, 2)).unbind(-1)
    return x * cos + torch.stack([-imag, real], dim=-1).flatten(-2) * sin


def attention(attn: nn.Module, x: torch.Tensor, context: torch.Tensor | None = None,
              bias: torch.Tensor | None = None,
              rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """LTXVideoAttnProcessor on its weights: q/k RMS norms across heads, RoPE on self-
    attention, an additive bias (B, 1, 1, L) on cross-attention keys. diffusers repeats its
    (B, 1, L) mask per head and reshapes it by the batch, which breaks an export with a
    dynamic batch; SDPA broadcasts this bias to the same numbers."""
    kv = x if context is None else context
    q, k, v = attn.norm_q(attn.to_q(x)), attn.norm_k(attn.to_k(kv)), attn.to_v(kv)
    if rope is not None:
        q, k = rotate(q, *rope), rotate(k, *rope)
    q, k, v = (t.unflatten(2, (attn.heads, -1)).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return attn.to_out[1](attn.to_out[0](out.transpose(1, 2).flatten(2)))


class LTXPrologue(nn.Module):
    """latent (B, C, F, h, w), t in [0, 1] (B,), caption (B, L, text width), caption_mask
    (B, L) -> tokens x (B, S, D), context (B, L, D), t_mod (B, 6, D), temb (B, D),
    caption_bias (B, 1, 1, L), rope_cos, rope_sin (S, D).

    t_mod is AdaLN-single's modulation, which every block adds to its own table (as
    PixArt's): rows 0 and 1 are the shift and scale of the first block's attention input,
    what the step cache compares. The RoPE tables are parameters, so they are stored like
    weights."""

    def __init__(self, model: nn.Module, rope: tuple[torch.Tensor, torch.Tensor],
                 num_train_timesteps: int) -> None:
        super().__init__()
        self.proj_in, self.time_embed = model.proj_in, model.time_embed
        self.caption_projection = model.caption_projection
        self.rope = nn.ParameterList([nn.Parameter(r.float().clone(), requires_grad=False)
                                      for r in rope])
        self.n_train = num_train_timesteps

    def forward(self, latent, t, caption, caption_mask):
        # LTXPipeline's packing at patch 1: (B, C, F, h, w) -> (B, F*h*w, C)
        x = self.proj_in(latent.flatten(2).transpose(1, 2))
        # the scheduler's timesteps are its sigmas x num_train_timesteps, in float32
        temb, embedded = self.time_embed(t * self.n_train, batch_size=latent.shape[0],
                                         hidden_dtype=x.dtype)
        bias = (1 - caption_mask.to(x.dtype)) * CAPTION_BIAS
        return (x, self.caption_projection(caption), temb.unflatten(1, (6, -1)), embedded,
                bias[:, None, None, :], self.rope[0] * 1, self.rope[1] * 1)


def modulation(block: nn.Module, t_mod: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A block's six (B, 1, D) rows: its table plus the shared modulation; shift, scale,
    gate of attention, then of the feed-forward."""
    return (block.scale_shift_table + t_mod).unsqueeze(2).unbind(1)


class LTXBlockCut(nn.Module):
    """One LTXVideoTransformerBlock (diffusers' forward; attention through `attention`)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x, context, t_mod, caption_bias, rope_cos, rope_sin):
        b = self.block
        shift, scale, gate, ff_shift, ff_scale, ff_gate = modulation(b, t_mod)
        h = b.norm1(x) * (1 + scale) + shift
        x = x + attention(b.attn1, h, rope=(rope_cos, rope_sin)) * gate
        x = x + attention(b.attn2, x, context, caption_bias)  # unmodulated, ungated
        return x + b.ff(b.norm2(x) * (1 + ff_scale) + ff_shift) * ff_gate


class MergedLTXBlock(nn.Module):
    """The TDTM variant of an LTX block (the same modules, so the same weights under the same
    names): self- and cross-attention see the tokens of consecutive latent frames averaged in
    pairs (frames 2i and 2i + 1; an odd last frame alone), each merged token with the RoPE
    of the first frame of its pair, and their outputs go back to both frames before the
    residual adds; the feed-forward runs on every token. LTX's self-attention is full 3D, so
    merging halves its queries and keys: it costs about a quarter."""

    def __init__(self, block: nn.Module, frames: int) -> None:
        super().__init__()
        self.block, self.frames = block, frames

    def forward(self, x, context, t_mod, caption_bias, rope_cos, rope_sin):
        b = self.block
        shift, scale, gate, ff_shift, ff_scale, ff_gate = modulation(b, t_mod)
        h = merge_token_frames(b.norm1(x) * (1 + scale) + shift, self.frames)
        rope = (pair_first_frames(rope_cos, self.frames, axis=0),
                pair_first_frames(rope_sin, self.frames, axis=0))
        x = x + unmerge_token_frames(attention(b.attn1, h, rope=rope), self.frames) * gate
        merged = merge_token_frames(x, self.frames)
        x = x + unmerge_token_frames(attention(b.attn2, merged, context, caption_bias),
                                     self.frames)
        return x + b.ff(b.norm2(x) * (1 + ff_scale) + ff_shift) * ff_gate


class LTXEpilogue(nn.Module):
    """tokens, temb -> velocity (B, C, F, h, w)."""

    def __init__(self, model: nn.Module, latent_shape: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.scale_shift_table = model.scale_shift_table
        self.norm_out, self.proj_out = model.norm_out, model.proj_out
        self.latent_shape = latent_shape

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.scale_shift_table + temb[:, None]).unsqueeze(2).unbind(1)
        x = self.proj_out(self.norm_out(x) * (1 + scale) + shift)
        return x.transpose(1, 2).reshape(-1, *self.latent_shape)  # unpacked


# ---------------------------------------------------------------- VAE decoder, graph friendly
#
# diffusers' LTX decoder as CoreML takes it, each piece equal to diffusers' module (tested
# torch.equal). coremltools 9 refuses three things in diffusers' code: the time padding
# joined by torch.concatenate (here torch.cat), a one-frame kernel's padding repeated 0
# times (here none), and a conditioned decoder's time modulation broadcast at rank 6 (here
# rank 5; CoreML takes rank 5 at most). Two more are rewritten though coremltools takes
# them: the upsamplers' and the unpatchify's depth to space, reshapes to rank 8 that it
# lowers by a pattern pass whose output cannot be run on Linux to check (here rank 5 at
# most, what the graph computes is what we test), and the RMS norms, which diffusers takes
# with the channels moved last and back (here over the channel axis where it stands: two
# transposes of the widest activations fewer per norm). The wrappers hold the pipeline's
# own modules and parameters under diffusers' names: they read the user's pipeline and
# never change it.

def channel_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """diffusers' RMSNorm without weights (the decoder's) over the channels of (B, C, T, H,
    W) in place: the same reduction over the same memory as diffusers' norm of
    x.movedim(1, -1), so the same numbers."""
    return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + eps)


def depth_to_space(x: torch.Tensor, t: int, s: int) -> torch.Tensor:
    """(B, C t s s, T, H, W), each channel group laid out (C, t, s along the height, s along
    the width) -> (B, C, T t, H s, W s), as diffusers' reshape to rank 8 and permute give
    it, at rank 5 at most: a 2D pixel_shuffle of the frames stacked along the height (a row
    t H + h lands on t H s + h s + j, the frame's rows kept apart), then the time factor out
    of the channels by one transpose."""
    b, _, f, h, w = x.shape
    x = F.pixel_shuffle(x.reshape(b, -1, f * h, w), s)
    if t == 1:
        return x.reshape(b, -1, f, h * s, w * s)
    x = x.reshape(b, -1, t, f, h * s * w * s).transpose(2, 3)
    return x.reshape(b, -1, f * t, h * s, w * s)


def unpatchify(h: torch.Tensor, p: int, p_t: int) -> torch.Tensor:
    """The decoder's output patches to pixels: (B, 3 p_t p p, T, H, W) -> (B, 3, T p_t, H p,
    W p). Each pixel's channels are (3, p_t, p, p) with the first p along the width, the
    second along the height (LTXVideoDecoder3d's layout): swapped to depth_to_space's order,
    height first, at rank 5."""
    b, _, f, y, x = h.shape
    h = h.reshape(b, -1, p, p, f * y * x).transpose(2, 3).reshape(b, -1, f, y, x)
    return depth_to_space(h, p_t, p)


def modulation_rows(table: torch.Tensor, emb: torch.Tensor, rows: int) -> list[torch.Tensor]:
    """A decoder time modulation: the embedding (B, rows C) split in rows plus the table
    (rows, C), each (B, C, 1, 1, 1). diffusers adds them at rank 6 with the frame axes
    already there; the same sums at rank 3."""
    return [r[..., None, None, None] for r in (emb.unflatten(1, (rows, -1)) + table).unbind(1)]


def embedded_time(embedder: nn.Module, temb: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """A decoder block's embedding (B, D) of the decode timestep, as its forward makes it."""
    return embedder(timestep=temb.flatten(), resolution=None, aspect_ratio=None,
                    batch_size=h.shape[0], hidden_dtype=h.dtype)


class GraphFriendlyCausalConv3d(nn.Module):
    """LTXVideoCausalConv3d: copies of the first (and, not causal, the last) frame padded in
    time, joined by torch.cat (diffusers' torch.concatenate); a one-frame kernel pads
    nothing, where diffusers joins empty copies (coremltools refuses a repeat of 0). That
    join hands the convolution a contiguous copy, and so does this: a permuted input (a
    LayerNorm's output moved back to channels first) takes another convolution path in
    PyTorch, which rounds otherwise."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv.conv
        pad = conv.kernel_size[0] - 1
        self.left, self.right = (pad, 0) if conv.is_causal else (pad // 2, pad // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x]
        if self.left:
            parts.insert(0, x[:, :, :1].repeat(1, 1, self.left, 1, 1))
        if self.right:
            parts.append(x[:, :, -1:].repeat(1, 1, self.right, 1, 1))
        return self.conv(torch.cat(parts, dim=2) if len(parts) > 1 else x.contiguous())


class GraphFriendlyResnet(nn.Module):
    """LTXVideoResnetBlock3d without injected noise (refused on load): norms over the
    channels, its time modulation from the block's embedding (B, 4C) at rank 5."""

    def __init__(self, resnet: nn.Module) -> None:
        super().__init__()
        self.eps1, self.eps2 = resnet.norm1.eps, resnet.norm2.eps
        self.nonlinearity, self.dropout = resnet.nonlinearity, resnet.dropout
        self.conv1 = GraphFriendlyCausalConv3d(resnet.conv1)
        self.conv2 = GraphFriendlyCausalConv3d(resnet.conv2)
        self.norm3 = resnet.norm3   # a LayerNorm where the channels change, kept as it is
        self.conv_shortcut = (None if resnet.conv_shortcut is None
                              else GraphFriendlyCausalConv3d(resnet.conv_shortcut))
        self.scale_shift_table = resnet.scale_shift_table  # None without conditioning

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        h = channel_rms_norm(x, self.eps1)
        if self.scale_shift_table is not None:
            shift_1, scale_1, shift_2, scale_2 = modulation_rows(self.scale_shift_table, temb, 4)
            h = h * (1 + scale_1) + shift_1
        h = self.conv1(self.nonlinearity(h))
        h = channel_rms_norm(h, self.eps2)
        if self.scale_shift_table is not None:
            h = h * (1 + scale_2) + shift_2
        h = self.conv2(self.dropout(self.nonlinearity(h)))
        if self.norm3 is not None:
            x = self.norm3(x.movedim(1, -1)).movedim(-1, 1)
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return h + x


class GraphFriendlyUpsampler(nn.Module):
    """LTXVideoUpsampler3d: conv, depth to space at rank 5, the first t - 1 frames dropped;
    for 0.9.5's residual upsamplers the input's own depth to space repeated over the
    channels, added."""

    def __init__(self, upsampler: nn.Module) -> None:
        super().__init__()
        self.conv = GraphFriendlyCausalConv3d(upsampler.conv)
        self.t, s, s_w = upsampler.stride
        if s != s_w:
            raise ValueError(f"LTXVideoUpsampler3d stride {upsampler.stride}: the height and "
                             "width factors must be equal")
        self.s, self.residual = s, upsampler.residual
        self.repeats = self.t * s * s // upsampler.upscale_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = depth_to_space(self.conv(x), self.t, self.s)[:, :, self.t - 1:]
        if not self.residual:
            return h
        residual = depth_to_space(x, self.t, self.s).repeat(1, self.repeats, 1, 1, 1)
        return h + residual[:, :, self.t - 1:]


class GraphFriendlyMidBlock(nn.Module):
    """LTXVideoMidBlock3d on graph-friendly resnets: h [, decode time] -> h."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.time_embedder = block.time_embedder   # None without conditioning
        self.resnets = nn.ModuleList([GraphFriendlyResnet(r) for r in block.resnets])

    def forward(self, h: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        if self.time_embedder is not None:
            temb = embedded_time(self.time_embedder, temb, h)
        for resnet in self.resnets:
            h = resnet(h, temb)
        return h


class GraphFriendlyUpBlock(nn.Module):
    """LTXVideoUpBlock3d on graph-friendly parts, one decoder stage over the whole clip:
    h [, decode time] -> h."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.conv_in = None if block.conv_in is None else GraphFriendlyResnet(block.conv_in)
        self.time_embedder = block.time_embedder
        self.upsamplers = None if block.upsamplers is None else nn.ModuleList(
            [GraphFriendlyUpsampler(u) for u in block.upsamplers])
        self.resnets = nn.ModuleList([GraphFriendlyResnet(r) for r in block.resnets])

    def forward(self, h: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        if self.conv_in is not None:  # diffusers hands it the block's input time as it is
            h = self.conv_in(h, temb)
        if self.time_embedder is not None:
            temb = embedded_time(self.time_embedder, temb, h)
        for upsampler in self.upsamplers or ():
            h = upsampler(h)
        for resnet in self.resnets:
            h = resnet(h, temb)
        return h


class LTXDecoderHead(nn.Module):
    """z (B, C, F, h, w) as the sampler gives it -> the mid block's output h (and, for a
    timestep-conditioned decoder, temb: the decode timestep times the decoder's multiplier,
    which every later stage takes). LTXPipeline's latent denormalisation z std / scale + mean
    (the VAE's buffers, stored here as weights); a conditioned decoder then mixes in the
    decode noise, (1 - s) z + s noise, as LTXPipeline does before decoding."""

    def __init__(self, vae: nn.Module) -> None:
        super().__init__()
        dec = vae.decoder
        # named as diffusers names the buffers (a plain "mean" clashes with a node of the
        # exported graph)
        self.latents_mean = nn.Parameter(vae.latents_mean.view(1, -1, 1, 1, 1).clone(),
                                         requires_grad=False)
        self.latents_std = nn.Parameter(vae.latents_std.view(1, -1, 1, 1, 1).clone(),
                                        requires_grad=False)
        self.scale = vae.config.scaling_factor
        self.conv_in = GraphFriendlyCausalConv3d(dec.conv_in)
        self.mid_block = GraphFriendlyMidBlock(dec.mid_block)
        # None without conditioning
        self.timestep_scale_multiplier = dec.timestep_scale_multiplier

    def forward(self, z, decode_t=None, decode_noise=None, decode_noise_scale=None):
        z = z * self.latents_std / self.scale + self.latents_mean
        if self.timestep_scale_multiplier is None:
            return self.mid_block(self.conv_in(z))
        s = decode_noise_scale.view(-1, 1, 1, 1, 1)
        h = self.conv_in((1 - s) * z + s * decode_noise)
        temb = decode_t * self.timestep_scale_multiplier
        return self.mid_block(h, temb), temb


class LTXDecoderOut(nn.Module):
    """h [, temb] -> frames (B, 3, T, H, W) in [0, 1]: the output norm, a conditioned
    decoder's last time modulation, conv_out, the patches back to pixels, and
    VideoProcessor's denormalisation."""

    def __init__(self, dec: nn.Module) -> None:
        super().__init__()
        self.eps = dec.norm_out.eps
        self.conv_act, self.conv_out = dec.conv_act, GraphFriendlyCausalConv3d(dec.conv_out)
        self.time_embedder, self.scale_shift_table = dec.time_embedder, dec.scale_shift_table
        self.patch, self.patch_t = dec.patch_size, dec.patch_size_t

    def forward(self, h, temb=None):
        h = channel_rms_norm(h, self.eps)
        if temb is not None:
            shift, scale = modulation_rows(self.scale_shift_table,
                                           embedded_time(self.time_embedder, temb, h), 2)
            h = h * (1 + scale) + shift
        h = unpatchify(self.conv_out(self.conv_act(h)), self.patch, self.patch_t)
        return (h / 2 + 0.5).clamp(0, 1)


# ---------------------------------------------------------------- the family's model

@dataclass
class LTXModel(PipelineModel):
    pipe: object                    # diffusers LTXPipeline, float32
    folder: Path
    height: int
    width: int
    frames: int
    frame_rate: float
    sampler: SamplerSettings
    decode: DecodeSettings | None   # None: a plain decoder (0.9.0)
    notes: list[str]
    name: str = NAME
    family: str = NAME
    text_tokens: int = TEXT_TOKENS
    chunked: dict[str, Chunking] = field(default_factory=dict)  # the decoder: whole clips
    device_storage: dict[str, StorageRule] = field(default_factory=dict)
    out_of_core: bool = False  # weights read block by block (edge/graph/lazy_weights.py)

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        pipe = self.pipe
        return (pipe.transformer.config.in_channels,
                (self.frames - 1) // pipe.vae_temporal_compression_ratio + 1,
                self.height // pipe.vae_spatial_compression_ratio,
                self.width // pipe.vae_spatial_compression_ratio)

    def _ids(self, prompts: list[str]) -> torch.Tensor:
        return self._tokens(prompts).input_ids

    def _tokens(self, prompts: list[str]):
        return self.pipe.tokenizer(prompts, padding="max_length", max_length=self.text_tokens,
                                   truncation=True, add_special_tokens=True,
                                   return_tensors="pt")

    def cut(self, shapes: Shapes | None = None) -> dict[str, list[Block]]:
        shapes = shapes or self.shapes("onnx")
        ids = self._ids(["a red circle moving left", "the dog"][:shapes.prompts])
        return {"text_encoder": cut_t5_encoder(self.pipe.text_encoder.encoder, ids),
                "transformer": self._cut_transformer(shapes.guidance_batch),
                "vae_decoder": self._cut_vae_decoder(shapes.videos)}

    def rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE cos/sin (S, D) LTXPipeline's call gives the transformer at this size and
        frame rate (its rope_interpolation_scale)."""
        pipe, (_, f, h, w) = self.pipe, self.latent_shape
        scale = (pipe.vae_temporal_compression_ratio / self.frame_rate,
                 pipe.vae_spatial_compression_ratio, pipe.vae_spatial_compression_ratio)
        probe = torch.zeros(1, f * h * w, 1)  # the module reads its batch size alone
        cos, sin = pipe.transformer.rope(probe, f, h, w, scale)
        return cos[0], sin[0]

    def _cut_transformer(self, batch: int) -> list[Block]:
        model = self.pipe.transformer
        g = torch.Generator().manual_seed(0)
        latent = torch.randn(batch, *self.latent_shape, generator=g)
        t = torch.rand(batch, generator=g)
        caption = torch.randn(batch, self.text_tokens, model.config.caption_channels,
                              generator=g)
        # prompts of different lengths, so the bias's rows differ
        mask = (torch.arange(self.text_tokens) < torch.arange(1, batch + 1)[:, None] * 5)
        mask = mask.long()
        pro_out = ["x", "context", "t_mod", "temb", "caption_bias", "rope_cos", "rope_sin"]
        pro = Block("transformer", "prologue",
                    LTXPrologue(model, self.rope(), self.sampler.num_train_timesteps).eval(),
                    ["latent", "t", "caption", "caption_mask"], pro_out,
                    (latent, t, caption, mask), [True] * 4,
                    dynamic_outputs=[True] * 5 + [False] * 2)
        feeds = dict(zip(pro_out, pro.run(*pro.example), strict=True))
        blocks = [pro]
        block_in = ["x", "context", "t_mod", "caption_bias", "rope_cos", "rope_sin"]
        frames = self.latent_shape[1]
        # blocks take the prologue's activations as stand-ins (Block.chained), made real
        # by edge.graph.blocks.chained as the exporters run them: the cut runs no block
        for i, b in enumerate(model.transformer_blocks):
            variants = {"tdtm": MergedLTXBlock(b, frames).eval()} if frames > 1 else {}
            blocks.append(Block("transformer", f"block_{i}", LTXBlockCut(b).eval(), block_in,
                                ["x"], tuple(feeds[n] for n in block_in),
                                [True] * 4 + [False] * 2, variants, chained=("x",)))
        blocks.append(Block("transformer", "epilogue",
                            LTXEpilogue(model, self.latent_shape).eval(), ["x", "temb"],
                            ["velocity"], (feeds["x"], feeds["temb"]), [True, True],
                            chained=("x",)))
        return blocks

    def _cut_vae_decoder(self, videos: int) -> list[Block]:
        """head, up_0 .., out over the whole clip; `videos`: the batch traced."""
        vae = self.pipe.vae
        g = torch.Generator().manual_seed(1)
        z = torch.randn(videos, *self.latent_shape, generator=g)
        ins, example = ["z"], (z,)
        if self.decode is not None:
            ins += ["decode_t", "decode_noise", "decode_noise_scale"]
            example += (torch.rand(videos, generator=g) * 0.1,
                        torch.randn(videos, *self.latent_shape, generator=g),
                        torch.rand(videos, generator=g) * 0.1)
        carried = ["h"] + (["temb"] if self.decode is not None else [])
        head = Block("vae_decoder", "head", LTXDecoderHead(vae).eval(), ins, carried, example,
                     [True] * len(ins))
        blocks = [head]
        feeds = head.run(*example)
        for i, up in enumerate(vae.decoder.up_blocks):
            block = Block("vae_decoder", f"up_{i}", GraphFriendlyUpBlock(up).eval(), carried,
                          ["h"], feeds, [True] * len(carried))
            blocks.append(block)
            feeds = (*block.run(*feeds), *feeds[1:])
        blocks.append(Block("vae_decoder", "out", LTXDecoderOut(vae.decoder).eval(), carried,
                            ["frames"], feeds, [True] * len(carried)))
        return blocks

    def package_fields(self, root: Path, raw_null_caption: bool = False) -> dict:
        fields = super().package_fields(root, raw_null_caption)
        fields["video"]["frame_rate"] = self.frame_rate
        if self.decode is not None:
            fields["decode"] = self.decode.to_dict()
        return fields

    def start(self, latents: np.ndarray | None, seed: int | None) -> dict:
        """Latents (B, C, F, h, w), packed here as LTXPipeline takes them, a seed, or both:
        then the seed's generator draws only the decode noise (LTXPipeline draws it from its
        generator after the latents, which it was not asked to draw)."""
        if latents is None and seed is None:
            raise ValueError("give the reference latents, a seed or both")
        start = {}
        if latents is not None:
            start["latents"] = self.pipe._pack_latents(torch.from_numpy(latents))
        if seed is not None:
            start["generator"] = torch.Generator("cpu").manual_seed(seed)
        return start

    def pipeline_options(self, seed: int | None, decode_timestep: float | None = None,
                         decode_noise_scale: float | None = None,
                         guidance_rescale: float = 0.0) -> dict:
        """`reference(..., decode_timestep=, decode_noise_scale=, guidance_rescale=)`: the
        decode settings (default: the model's), LTXPipeline's guidance_rescale (the sampler
        setting of the same name); the frame rate the model was exported for."""
        options = {"frame_rate": self.frame_rate, "guidance_rescale": guidance_rescale}
        if self.decode is not None:
            t, s = decode_values(self.decode.to_dict(), decode_timestep, decode_noise_scale)
            if s and seed is None:  # LTXPipeline would draw it from the global generator
                raise ValueError("a decode noise scale over 0 needs a seed for the decode "
                                 "noise")
            options |= {"decode_timestep": t, "decode_noise_scale": s}
        return options


def check_size(folder: Path) -> dict[str, int]:
    """The small size an export's end-to-end check may run at (`--check small`): a few
    latent frames, two patches a side."""
    shapes = check_components(folder)
    side = 2 * video_multiple(shapes)
    return {"height": side, "width": side, "frames": shapes.temporal + 1}


def accepts(folder: Path, height: int | None = None, width: int | None = None,
            frames: int | None = None, steps: int | None = None,
            sigmas: tuple[float, ...] | None = None,
            frame_rate: float | None = None, decode_timestep: float | None = None,
            decode_noise_scale: float | None = None) -> Accepted:
    """What this family takes, from the folder's JSON files alone (nothing loaded): every
    component, the components against each other, the scheduler as edge's sampler (its
    shift from this size's latent tokens), the video size (default LTXPipeline's 512 x 704,
    161 frames) and frame rate (default 25) against the model, the decode settings against
    the decoder. Refuses anything else with a FamilyError naming the file, field or
    option."""
    check_folder(folder)
    shapes = check_components(folder)
    given = {"height": height, "width": width, "frames": frames}
    size = {k: DEFAULT_SIZE[k] if v is None else v for k, v in given.items()}
    rate = FRAME_RATE if frame_rate is None else frame_rate
    check_video_size(shapes, **size, frame_rate=rate)
    decode = decode_settings(shapes, folder / "vae" / "config.json", decode_timestep,
                             decode_noise_scale)
    sampler = sampler_settings(folder / "scheduler" / "scheduler_config.json",
                               latent_tokens(shapes, **size))
    return Accepted(size, with_steps(sampler, steps, sigmas),
                    {"frame_rate": rate, "decode": decode})



def load(folder: Path, out_of_core: bool | None = None, **options) -> LTXModel:
    """The folder's LTXPipeline as an edge model at this size; `options`: what `accepts`
    takes. `frame_rate`: the frames per second the RoPE positions are scaled for
    (LTXPipeline's frame_rate); `decode_timestep`, `decode_noise_scale`: the manifest's
    defaults for a timestep-conditioned decoder (LTXPipeline's: 0 and the timestep's value),
    which a generation may override; `out_of_core`: build the models without weights and read
    each block's when it is exported (default: when the float32 weights exceed half this
    machine's memory)."""
    return load_family(folder, accepts, load_pipeline, LTXModel, out_of_core, **options)
