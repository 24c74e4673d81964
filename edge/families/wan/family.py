"""Wan 2.1 and Wan 2.2 TI2V-5B text-to-video (diffusers `WanPipeline`): UMT5 text encoder,
`WanTransformer3DModel`, `AutoencoderKLWan`, from a local diffusers pipeline folder. Wan 2.2's
per-token timesteps (`expand_timesteps`: all equal in text to video) are one per video here;
its residual VAE (48 channels, RGB in 2x2 patches) is cut like Wan 2.1's, its up blocks'
duplicated shortcut and the final unpatchify written at rank 5 (`duplicate_up`, `unpatchify`).

Cuts (each chained component equals the diffusers component; tests/test_wan.py):
  text_encoder  embeddings (token embedding; the attention mask as an additive bias),
                layer_0 .. layer_{N-1} (each UMT5 layer computes its own relative position
                bias inside), final (final norm; states past the prompt zeroed, as
                WanPipeline does before the transformer sees them; edge/families/t5.py)
  transformer   prologue (patch embedding, RoPE cos/sin from tables stored as weights,
                condition embedder: time -> temb and the 6-row modulation, text -> context),
                block_0 .. block_{N-1} (each with a "tdtm" variant: temporal token merging
                of consecutive latent frames around both attentions), epilogue (modulated
                norm, proj_out, unpatchify)
  vae_decoder   head (latents denormalised, post_quant_conv, conv_in, mid block),
                up_0 .. up_3, out (norm, conv_out, clamp, to [0, 1]): run once per latent
                frame, each stage's feature cache an explicit input and output

The VAE decoder is causal in time and diffusers decodes it latent frame by latent frame with a
feature cache (each causal convolution keeps the last two frames it saw). The runtime does the
same (a chunked component, `edge.graph.blocks.Chunking`): each stage takes one frame's activations
and its cache, and gives the next stage's activations and its new cache, which the runtime
hands back to the stage on the next frame. The first frame runs each stage's "first" variant
(no cache in; the 3D upsamplers do not double it in time). Memory holds one frame's
activations and the caches, not the whole clip's: decoding a stage over the whole clip at
once would need 12 GB for one activation of the last stage at Wan's 81 frames of 480x832.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from edge.core.sampler import SamplerSettings
from edge.core.tiles import Tiling
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
from edge.families.pipeline_run import (
    Accepted,
    PipelineModel,
    load_family,
    with_steps,
)
from edge.families.t5 import cut_umt5_encoder
from edge.families.wan import NAME
from edge.graph.blocks import Block, Chunking
from edge.graph.family_model import Shapes, StorageRule
from edge.graph.lazy_weights import materialized
from edge.graph.reference_device import on_device_of
from edge.models.tdtm import merge_token_frames, pair_first_frames, unmerge_token_frames

COMPONENTS = ("text_encoder", "tokenizer", "transformer", "vae", "scheduler")
DEFAULT_SIZE = {"height": 480, "width": 832, "frames": 81}     # Wan 2.1's own defaults
TEXT_TOKENS = 512                                             # WanPipeline's max_sequence_length
GUIDANCE = 5.0
STEPS = 50
TIMESTEP_SCALE = 1000.0   # the transformer takes timesteps in training steps
CACHE_FRAMES = 2          # frames each causal convolution of the VAE keeps (diffusers' CACHE_T)


# ---------------------------------------------------------------- loading and checks

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
                     ffn_dim=int_field(tr, "ffn_dim"), decoder_channels=base * mult[0])


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


# ---------------------------------------------------------------- transformer blocks

def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's RoPE on interleaved pairs, built with stack (diffusers writes out[..., 0::2],
    which exports as ScatterND)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)


def attention(attn: nn.Module, x: torch.Tensor, context: torch.Tensor | None = None,
              rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """WanAttention's computation (diffusers' WanAttnProcessor, text-only) on its weights."""
    source = x if context is None else context
    q = attn.norm_q(attn.to_q(x)).unflatten(2, (attn.heads, -1))
    k = attn.norm_k(attn.to_k(source)).unflatten(2, (attn.heads, -1))
    v = attn.to_v(source).unflatten(2, (attn.heads, -1))
    if rope is not None:
        q, k = rotate(q, *rope), rotate(k, *rope)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return attn.to_out[1](attn.to_out[0](out.transpose(1, 2).flatten(2)))


class WanPrologue(nn.Module):
    """latent (B, C, T, H, W), t in [0, 1] (B,), caption (B, L, text_dim) -> tokens x, the
    modulation t_mod (B, 6, D), temb (B, D), context (B, L, D), RoPE cos/sin (1, S, 1, d/2).
    The RoPE tables are parameters here, so they are stored like weights, not graph
    constants."""

    def __init__(self, model: nn.Module, latent_shape: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.patch_embedding = model.patch_embedding
        self.condition_embedder = model.condition_embedder
        rope = model.rope
        self.split = [rope.t_dim, rope.h_dim, rope.w_dim]
        self.rope_cos = nn.Parameter(rope.freqs_cos.float().clone(), requires_grad=False)
        self.rope_sin = nn.Parameter(rope.freqs_sin.float().clone(), requires_grad=False)
        p_t, p_h, p_w = model.config.patch_size
        _, t, h, w = latent_shape
        self.grid = (t // p_t, h // p_h, w // p_w)

    def _rope_table(self, table: torch.Tensor) -> torch.Tensor:
        f, h, w = self.grid
        parts = table.split(self.split, dim=1)
        grid = torch.cat([parts[0][:f].view(f, 1, 1, -1).expand(f, h, w, -1),
                          parts[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
                          parts[2][:w].view(1, 1, w, -1).expand(f, h, w, -1)], dim=-1)
        return grid.reshape(1, f * h * w, 1, -1)

    def forward(self, latent: torch.Tensor, t: torch.Tensor, caption: torch.Tensor):
        x = self.patch_embedding(latent).flatten(2).transpose(1, 2)
        temb, t_proj, context, _ = self.condition_embedder(t * TIMESTEP_SCALE, caption, None)
        cos = self._rope_table(self.rope_cos)[..., 0::2]
        sin = self._rope_table(self.rope_sin)[..., 1::2]
        return x, t_proj.unflatten(1, (6, -1)), temb, context, cos, sin


class WanBlock(nn.Module):
    """One WanTransformerBlock (diffusers' forward, attention through `attention`)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x, t_mod, context, rope_cos, rope_sin):
        b = self.block
        shift, scale, gate, c_shift, c_scale, c_gate = (b.scale_shift_table + t_mod).chunk(6, 1)
        h = b.norm1(x) * (1 + scale) + shift
        x = x + attention(b.attn1, h, rope=(rope_cos, rope_sin)) * gate
        x = x + attention(b.attn2, b.norm2(x), context)
        h = b.norm3(x) * (1 + c_scale) + c_shift
        return x + b.ffn(h) * c_gate


class MergedWanBlock(nn.Module):
    """The TDTM variant of a Wan block (the same modules, so the same weights under the same
    names): self- and cross-attention see the tokens of consecutive latent frames averaged in
    pairs (frames 2i and 2i + 1; an odd last frame alone), each merged token with the RoPE
    of the first frame of its pair, and their outputs go back to both frames before the
    residual adds; the feed-forward runs on every token. Wan's attention is full 3D, so
    merging halves the keys and the queries: self-attention costs about a quarter."""

    def __init__(self, block: nn.Module, frames: int) -> None:
        super().__init__()
        self.block, self.frames = block, frames

    def forward(self, x, t_mod, context, rope_cos, rope_sin):
        b = self.block
        rope = (pair_first_frames(rope_cos, self.frames, axis=1),
                pair_first_frames(rope_sin, self.frames, axis=1))
        shift, scale, gate, c_shift, c_scale, c_gate = (b.scale_shift_table + t_mod).chunk(6, 1)
        h = merge_token_frames(b.norm1(x) * (1 + scale) + shift, self.frames)
        x = x + unmerge_token_frames(attention(b.attn1, h, rope=rope), self.frames) * gate
        merged = merge_token_frames(b.norm2(x), self.frames)
        x = x + unmerge_token_frames(attention(b.attn2, merged, context), self.frames)
        h = b.norm3(x) * (1 + c_scale) + c_shift
        return x + b.ffn(h) * c_gate


class WanEpilogue(nn.Module):
    """tokens, temb -> velocity (B, C, T, H, W)."""

    def __init__(self, model: nn.Module, latent_shape: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.scale_shift_table = model.scale_shift_table
        self.norm_out, self.proj_out = model.norm_out, model.proj_out
        self.patch = tuple(model.config.patch_size)
        _, t, h, w = latent_shape
        p_t, p_h, p_w = self.patch
        self.grid = (t // p_t, h // p_h, w // p_w)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        x = self.proj_out(self.norm_out(x) * (1 + scale) + shift)
        f, h, w = self.grid
        x = x.reshape(x.shape[0], f, h, w, *self.patch, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)


# ---------------------------------------------------------------- VAE decoder blocks

class WanDecoderChunk(nn.Module):
    """One stage of the causal decoder on one chunk (one latent frame's worth, run frame by
    frame), its feature cache explicit: x, *cache -> x, *cache. `first`: the first chunk, as
    diffusers runs it (no cache in; the 3D upsamplers do not double it in time) -> x, *cache.

    The cache is made uniform so that every chunk after the first takes the same shapes:
    each entry holds two frames. diffusers' first chunk leaves one frame (or, for an
    upsampler's time convolution, the mark "Rep"); a zero frame in front (all zeros for
    "Rep") computes the same, because a causal convolution pads with zeros where the cache
    is short."""

    def __init__(self, run: Callable, modules: dict[str, nn.Module], first: bool,
                 head: Callable | None = None, tail: Callable | None = None) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(modules)
        self.run_chunk, self.first, self.head, self.tail = run, first, head, tail

    def forward(self, x: torch.Tensor, *cache_in: torch.Tensor):
        if self.head is not None:
            x = self.head(self.parts, x)
        cache: list = [None] * 64 if self.first else [*cache_in]
        # one input frame at a time: after the 3D upsamplers a latent frame is 2 or 4 frames,
        # and a causal convolution over them one by one (cache carried) computes the same as
        # over all at once, holding one frame's activations instead of four
        outs, used = [], 0
        for f in range(x.shape[2]):
            idx = [0]
            outs.append(self.run_chunk(self.parts, x[:, :, f:f + 1], cache, idx, self.first))
            used = idx[0]
        if not self.first and used != len(cache_in):
            raise ValueError(f"the stage used {used} cache entries, {len(cache_in)} given")
        cache_out = [self._uniform(entry, x) for entry in cache[:used]]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, 2)
        out = out if self.tail is None else self.tail(self.parts, out)
        return (out, *cache_out)

    def _uniform(self, entry, x: torch.Tensor) -> torch.Tensor:
        # The zeros are computed from the data (zero times a value, broadcast) rather than
        # made as tensors of a static shape, which a converter folds into constants stored
        # with the program: in a device package each first-piece program would carry its
        # cache's zero frames in its weight file (tens of MB per stage at 480x832).
        if isinstance(entry, str):  # "Rep": the upsampler's time convolution, not yet run
            dim = self.parts["up"].resampler.dim
            return (x[:, :1, :1] * 0).expand(x.shape[0], dim, CACHE_FRAMES, *x.shape[3:])
        if entry.shape[2] < CACHE_FRAMES:
            pad = (entry[:, :, :1] * 0).expand(-1, -1, CACHE_FRAMES - entry.shape[2], -1, -1)
            return torch.cat([pad, entry], 2)
        return entry


def _cached_conv(conv: nn.Module, x: torch.Tensor, cache: list, idx: list[int]) -> torch.Tensor:
    """diffusers' feature-cache step around one causal convolution (the decoder's conv_in
    and conv_out)."""
    i = idx[0]
    cache_x = x[:, :, -2:].clone()
    if cache_x.shape[2] < 2 and cache[i] is not None:
        cache_x = torch.cat([cache[i][:, :, -1:], cache_x], dim=2)
    out = conv(x, cache[i])
    cache[i] = cache_x
    idx[0] += 1
    return out


class GraphFriendlyResample(nn.Module):
    """diffusers' `WanResample` upsampling ("upsample2d", "upsample3d") with its very
    parameters (same names), computed with ops every target takes: nearest upsampling, which
    at Wan's integer scale of 2 picks the pixels nearest-exact picks (CoreML has no
    nearest-exact), and the time convolution's two output frames interleaved through a rank-5
    view (diffusers reshapes to rank 6; CoreML allows rank 5 at most). The feature cache
    steps are diffusers': "Rep" before the first frame has passed, else the last two input
    frames. Tested equal to `WanResample`."""

    def __init__(self, resample: nn.Module) -> None:
        super().__init__()
        if resample.mode not in ("upsample2d", "upsample3d"):
            raise ValueError(f"resample mode {resample.mode!r}: only upsampling is decoded")
        self.mode, self.dim = resample.mode, resample.dim
        self.resample = nn.Sequential(nn.Upsample(scale_factor=2.0, mode="nearest"),
                                      resample.resample[1])
        if self.mode == "upsample3d":
            self.time_conv = resample.time_conv

    def _doubled_in_time(self, x: torch.Tensor, feat_cache: list, feat_idx: list[int]):
        i = feat_idx[0]
        feat_idx[0] += 1
        if feat_cache[i] is None:  # the first frame passes undoubled
            feat_cache[i] = "Rep"
            return x
        cached = feat_cache[i]
        keep = x[:, :, -CACHE_FRAMES:].clone()
        if keep.shape[2] < CACHE_FRAMES:  # one frame: the one before it (zeros after "Rep")
            before = keep * 0 if isinstance(cached, str) else cached[:, :, -1:]  # see _uniform
            keep = torch.cat([before, keep], 2)
        y = self.time_conv(x) if isinstance(cached, str) else self.time_conv(x, cached)
        feat_cache[i] = keep
        b, c, t, h, w = x.shape
        even, odd = y[:, :c].flatten(3), y[:, c:].flatten(3)     # (b, c, t, h*w) each
        return torch.stack((even, odd), 3).reshape(b, c, 2 * t, h, w)

    def forward(self, x: torch.Tensor, feat_cache: list | None = None,
                feat_idx: list[int] | None = None) -> torch.Tensor:
        if self.mode == "upsample3d" and feat_cache is not None:
            x = self._doubled_in_time(x, feat_cache, feat_idx)
        b, c, t, h, w = x.shape
        y = self.resample(x.transpose(1, 2).reshape(b * t, c, h, w))
        return y.view(b, t, *y.shape[1:]).transpose(1, 2)


class GraphFriendlyUpBlock(nn.Module):
    """A decoder up block (`WanUpBlock`) over the same residual blocks, its upsampler the
    graph-friendly one: the parameters keep their names."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.resnets = block.resnets
        self.upsamplers = (None if block.upsamplers is None else
                           nn.ModuleList([GraphFriendlyResample(block.upsamplers[0])]))

    @property
    def resampler(self) -> GraphFriendlyResample | None:
        return None if self.upsamplers is None else self.upsamplers[0]

    def forward(self, x, feat_cache=None, feat_idx=None, first_chunk=None) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x, feat_cache=feat_cache, feat_idx=feat_idx)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, feat_cache=feat_cache, feat_idx=feat_idx)
        return x


def _frames_to_batch_shuffle(x: torch.Tensor, factor: int) -> torch.Tensor:
    """pixel_shuffle of every frame: (B, C * f * f, T, H, W) -> (B, C, T, H f, W f), with
    ranks of 5 at most (CoreML's limit; diffusers' DupUp3D and unpatchify go to rank 8)."""
    b, c, t, h, w = x.shape
    y = F.pixel_shuffle(x.transpose(1, 2).reshape(b * t, c, h, w), factor)
    return y.view(b, t, *y.shape[1:]).transpose(1, 2)


def duplicate_up(x: torch.Tensor, out_channels: int, factor_t: int, factor_s: int,
                 first_chunk: bool) -> torch.Tensor:
    """diffusers' `DupUp3D` (Wan 2.2's parameter-free shortcut around an up block): each
    channel repeated, then spread over factor_t frames and factor_s x factor_s pixels; the
    first chunk keeps the last of the frames, as the upsampler does not double it in time."""
    b, c, t, h, w = x.shape
    repeats = out_channels * factor_t * factor_s ** 2 // c
    x = x.flatten(2).unsqueeze(2).expand(b, c, repeats, t * h * w).reshape(b, c * repeats,
                                                                            t, h, w)
    y = _frames_to_batch_shuffle(x, factor_s)                 # (b, out * ft, t, H, W)
    y = y.reshape(b, out_channels, factor_t, t, -1).transpose(2, 3)
    y = y.reshape(b, out_channels, t * factor_t, h * factor_s, w * factor_s)
    return y[:, :, factor_t - 1:] if first_chunk else y


def unpatchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """diffusers' Wan `unpatchify` (channels c p p -> c, pixels p x p; its first patch index
    goes to the width), at rank 5 at most."""
    b, cpp, t, h, w = x.shape
    swapped = x.reshape(b, cpp // patch ** 2, patch, patch, t * h * w).transpose(2, 3)
    return _frames_to_batch_shuffle(swapped.reshape(b, cpp, t, h, w), patch)


class GraphFriendlyResidualUpBlock(nn.Module):
    """Wan 2.2's decoder up block (`WanResidualUpBlock`): the residual blocks and the
    graph-friendly upsampler, plus the block's input duplicated up to its output's size
    (`duplicate_up`) and added. The parameters keep their names."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.resnets = block.resnets
        self.upsampler = (None if block.upsampler is None
                          else GraphFriendlyResample(block.upsampler))
        dup = block.avg_shortcut
        self.shortcut = None if dup is None else (dup.out_channels, dup.factor_t, dup.factor_s)

    @property
    def resampler(self) -> GraphFriendlyResample | None:
        return self.upsampler

    def forward(self, x, feat_cache=None, feat_idx=None, first_chunk=False) -> torch.Tensor:
        block_in = x
        for resnet in self.resnets:
            x = resnet(x, feat_cache=feat_cache, feat_idx=feat_idx)
        if self.upsampler is not None:
            x = self.upsampler(x, feat_cache=feat_cache, feat_idx=feat_idx)
        if self.shortcut is not None:
            x = x + duplicate_up(block_in, *self.shortcut, bool(first_chunk))
        return x


def graph_friendly_up_block(block: nn.Module) -> nn.Module:
    """Wan 2.1's up block or Wan 2.2's residual one, rewritten for every target."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanResidualUpBlock

    if isinstance(block, WanResidualUpBlock):
        return GraphFriendlyResidualUpBlock(block)
    return GraphFriendlyUpBlock(block)


def cut_vae_decoder(vae: nn.Module, first: bool, clamp: bool = True
                    ) -> list[tuple[str, nn.Module]]:
    """(name, stage) pairs for one chunk of latents (B, C, 1, h, w) as the sampler makes
    them; `first`: the stages for the first chunk. The frames come out in [0, 1], or with
    `clamp` False as (x + 1) / 2 of the decoder's raw x (a tile, clamped after blending)."""
    dec = vae.decoder
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)

    def denormalise(parts, z):
        return parts["post_quant_conv"](z * on_device_of(std, z).to(z.dtype)
                                        + on_device_of(mean, z).to(z.dtype))

    def head(parts, x, cache, idx, first):
        return parts["mid_block"](_cached_conv(parts["conv_in"], x, cache, idx), cache, idx)

    def up(parts, x, cache, idx, first):
        return parts["up"](x, feat_cache=cache, feat_idx=idx, first_chunk=first)

    def out(parts, x, cache, idx, first):
        return _cached_conv(parts["conv_out"], parts["nonlinearity"](parts["norm_out"](x)),
                            cache, idx)

    patch = vae.config.patch_size  # Wan 2.2: RGB comes out in patch x patch cells

    def to_unit(parts, x):
        x = x if patch is None else unpatchify(x, patch)
        return ((x.clamp(-1, 1) if clamp else x) + 1) / 2

    stages = [("head", WanDecoderChunk(head, {"post_quant_conv": vae.post_quant_conv,
                                              "conv_in": dec.conv_in,
                                              "mid_block": dec.mid_block}, first, denormalise))]
    for i, block in enumerate(dec.up_blocks):
        stages.append((f"up_{i}", WanDecoderChunk(up, {"up": graph_friendly_up_block(block)},
                                                  first)))
    stages.append(("out", WanDecoderChunk(out, {"norm_out": dec.norm_out,
                                               "nonlinearity": dec.nonlinearity,
                                               "conv_out": dec.conv_out}, first,
                                          tail=to_unit)))
    return stages


# ---------------------------------------------------------------- the family's model

# --quantize 4 on the device, measured at Wan 2.1 1.3B's shapes (docs/benchmarks.md, "Wan's
# 4"). The transformer (92% of those bytes) and the text encoder (the real UMT5-XXL is 4x the
# transformer) take 4 bits, as int4 with a scale per 32 inputs: on a transformer block its
# output error is that of 4-bit tables per group of 16 channels (0.53% against 0.47%), which
# cost 14x the conversion time (72 s a block: over an hour for the 30 blocks and their TDTM
# functions). The VAE decoder stays at int8: at 4 bits each stage's output is 10% off, and a
# 4-bit decoder was what sank tiny-sora's rule on Wan (26.5 dB). End to end 41.8 dB, 0.1 dB
# under the text encoder at int8.
STORAGE_4 = StorageRule(
    (("text_encoder/*", "int4-b32"), ("transformer/*", "int4-b32"), ("vae_decoder/*", "int8")),
    psnr_floor_db=35.0,
    note="the text encoder and the transformer at 4 bits, as int4 with a scale per 32 "
         "inputs; the VAE decoder at int8")


@dataclass
class WanModel(PipelineModel):
    pipe: object                    # diffusers WanPipeline, float32
    folder: Path
    height: int
    width: int
    frames: int
    sampler: SamplerSettings
    notes: list[str]
    name: str = NAME
    family: str = NAME
    text_tokens: int = TEXT_TOKENS
    # the causal VAE decoder runs latent frame by latent frame, its caches carried
    chunked: dict[str, Chunking] = field(default_factory=lambda: {
        "vae_decoder": Chunking(input="z", output="frames", axis=2, size=1,
                                first_variant="first")})
    device_storage: dict[str, StorageRule] = field(default_factory=lambda: {"4": STORAGE_4})
    out_of_core: bool = False  # weights read block by block (edge/graph/lazy_weights.py)
    clean = "wan"  # WanPipeline's prompt_clean

    @property
    def tiled(self) -> dict[str, Tiling]:
        """The decoder in spatial tiles, as the pipeline's VAE tiles it (its tile size and
        stride; diffusers' defaults 256 and 192 pixels, edge/core/tiles.py). Wan 2.2's decoder
        (RGB in patches) is not tiled yet."""
        vae = self.pipe.vae
        if vae.config.patch_size is not None:
            return {}
        scale = vae.spatial_compression_ratio
        return {"vae_decoder": Tiling(
            (vae.tile_sample_min_height // scale, vae.tile_sample_min_width // scale),
            (vae.tile_sample_stride_height // scale, vae.tile_sample_stride_width // scale),
            scale)}

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        vae = self.pipe.vae
        return (vae.config.z_dim, (self.frames - 1) // self.pipe.vae_scale_factor_temporal + 1,
                self.height // self.pipe.vae_scale_factor_spatial,
                self.width // self.pipe.vae_scale_factor_spatial)

    def _ids(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean

        enc = self.pipe.tokenizer([prompt_clean(p) for p in prompts], padding="max_length",
                                  max_length=self.text_tokens, truncation=True,
                                  add_special_tokens=True, return_attention_mask=True,
                                  return_tensors="pt")
        return enc.input_ids, enc.attention_mask

    def cut(self, shapes: Shapes | None = None) -> dict[str, list[Block]]:
        shapes = shapes or self.shapes("onnx")
        ids, mask = self._ids(["a red circle moving left", "the dog"][:shapes.prompts])
        return {"text_encoder": cut_umt5_encoder(self.pipe.text_encoder.encoder, ids, mask),
                "transformer": self._cut_transformer(shapes.guidance_batch),
                "vae_decoder": self._cut_vae_decoder(
                    shapes.videos, tiled=shapes.tiled_decoder and bool(self.tiled))}

    def _cut_transformer(self, batch: int) -> list[Block]:
        model = self.pipe.transformer
        g = torch.Generator().manual_seed(0)
        latent = torch.randn(batch, *self.latent_shape, generator=g)
        t = torch.rand(batch, generator=g)
        caption = torch.randn(batch, self.text_tokens, model.config.text_dim, generator=g)
        pro = Block("transformer", "prologue", WanPrologue(model, self.latent_shape).eval(),
                    ["latent", "t", "caption"],
                    ["x", "t_mod", "temb", "context", "rope_cos", "rope_sin"],
                    (latent, t, caption), [True, True, True],
                    dynamic_outputs=[True, True, True, True, False, False])
        # the prologue's outputs are real; a block's input "x" is the prologue's as a
        # stand-in of its shape, made real by `edge.graph.blocks.chained` where an exporter runs
        # the blocks (at 480p the forward pass it saves is ~15 minutes here, and the
        # examples ~100 MB a block)
        x, t_mod, temb, context, cos, sin = pro.run(*pro.example)
        blocks = [pro]
        frames = self.latent_shape[1] // model.config.patch_size[0]
        for i, b in enumerate(model.blocks):
            variants = {"tdtm": MergedWanBlock(b, frames).eval()} if frames > 1 else {}
            blocks.append(Block("transformer", f"block_{i}", WanBlock(b).eval(),
                                ["x", "t_mod", "context", "rope_cos", "rope_sin"], ["x"],
                                (x, t_mod, context, cos, sin), [True, True, True, False, False],
                                variants, chained=("x",)))
        blocks.append(Block("transformer", "epilogue", WanEpilogue(model, self.latent_shape),
                            ["x", "temb"], ["velocity"], (x, temb), [True, True],
                            chained=("x",)))
        return blocks

    def _cut_vae_decoder(self, videos: int, tiled: bool = False) -> list[Block]:
        """One block per stage, run once per latent frame (`chunked`); its variant "first"
        is the first frame's. `videos`: the batch traced (a dynamic batch traced at 1 would
        be specialised to 1). `tiled`: graphs of any tile's height and width, whose frames
        are left unclamped for the runtime to blend and then clamp (edge/core/tiles.py), traced,
        validated and estimated at one tile: what a call runs."""
        g = torch.Generator().manual_seed(1)
        z = torch.randn(videos, *self.latent_shape, generator=g)
        if tiled:
            rows, cols = self.tiled["vae_decoder"].latent_size
            z = z[..., :rows, :cols]
        # a one-frame video runs only "first"; its later-frame graphs get a stand-in frame
        first_x, x = z[:, :, :1], z[:, :, 1:2] if z.shape[2] > 1 else z[:, :, :1]
        firsts = dict(cut_vae_decoder(self.pipe.vae, first=True, clamp=not tiled))
        blocks = []
        for i, (name, stage) in enumerate(cut_vae_decoder(self.pipe.vae, first=False,
                                                          clamp=not tiled)):
            x_in, x_out = ("z" if i == 0 else "h"), ("frames" if name == "out" else "h")
            with torch.no_grad(), materialized(stage), materialized(firsts[name]):
                first_out = firsts[name](first_x)
                # the second frame, after the first frame's cache: the shapes every later
                # frame has
                out = stage(x, *first_out[1:])
            # CoreML feature names take no "."
            state = [f"{name}_cache_{k}" for k in range(len(first_out) - 1)]
            dyn = [True] * (1 + len(state))
            first = Block("vae_decoder", name, firsts[name].eval(), [x_in], [x_out, *state],
                          (first_x,), [True], dynamic_space=tiled)
            block = Block("vae_decoder", name, stage.eval(), [x_in, *state], [x_out, *state],
                          (x, *first_out[1:]), dyn, {"first": first}, dynamic_space=tiled)
            blocks.append(block)
            first_x, x = first_out[0], out[0]
        return blocks

def check_size(folder: Path) -> dict[str, int]:
    """The small size an export's end-to-end check may run at (`--check small`): two latent
    frames, two patches a side."""
    shapes = check_components(folder)
    return {"height": 2 * shapes.spatial * shapes.patch[1],
            "width": 2 * shapes.spatial * shapes.patch[2], "frames": shapes.temporal + 1}


def accepts(folder: Path, height: int | None = None, width: int | None = None,
            frames: int | None = None, steps: int | None = None,
            sigmas: tuple[float, ...] | None = None) -> Accepted:
    """The one place that says what this family takes, from the folder's JSON files alone
    (nothing loaded, seconds at most): every component, the components against each other,
    the scheduler as edge's sampler, the video size against the model. Returns the size and
    the sampler; refuses anything else with a FamilyError naming the file, field or option."""
    given = {"height": height, "width": width, "frames": frames}
    size = {k: DEFAULT_SIZE[k] if v is None else v for k, v in given.items()}
    check_folder(folder)
    shapes = check_components(folder)
    check_video_size(shapes, **size)
    config = folder / "scheduler" / "scheduler_config.json"
    sampler = sampler_settings(config)
    return Accepted(size, with_steps(sampler, steps, sigmas))


def load(folder: Path, out_of_core: bool | None = None, **options) -> WanModel:
    """The folder's WanPipeline as an edge model; `options`: what `accepts` takes.
    `out_of_core`: build the models without weights and read each block's when it is
    exported (default: when the float32 weights exceed half this machine's memory)."""
    return load_family(folder, accepts, load_pipeline, WanModel, out_of_core, **options)
