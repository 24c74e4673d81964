"""CogVideoX 1.0 text-to-video, 2B and 5B (diffusers `CogVideoXPipeline`): T5 v1.1 text
encoder, `CogVideoXTransformer3DModel`, `AutoencoderKLCogVideoX`, `CogVideoXDDIMScheduler`,
from a local diffusers pipeline folder.

Cuts (each chained component equals the diffusers component; tests/test_cogvideox.py):
  text_encoder  embeddings, layer_0 (gives the relative position bias), layer_1 ..
                layer_{N-1} (take it), final (edge/families/t5.py); no mask: CogVideoX
                encodes the padded ids alone
  transformer   prologue (time embedding; caption projection; patch embedding plus, for 2B,
                the 3D sin-cos position table; for 5B, the 3D rotary cos/sin tables; both
                computed at the export size and stored as weights), block_0 .. block_{N-1}
                (joint attention over [caption; video] tokens: each block takes and gives
                both), epilogue (final norms, proj_out, unpatchify)
  vae_decoder   head (latents to the decoder's layout and scale, conv_in, mid block),
                up_0 .. up_3, out (spatial norm, conv_out, to [0, 1])

Latents are (B, F, C, h, w), frames before channels, as diffusers lays them out and draws
their noise. The VAE decoder runs as diffusers runs it: two latent frames per call after a
first call of two or three (an odd count's first frame decodes alone in time), each causal
convolution's cache of the last two frames carried between calls (a chunked component). The
calls cannot be cut finer: the decoder's group norms span the frames of one call, and its
time upsamplers treat an odd call's first frame apart, so other pieces give another video.
Every stage takes the call's latents too (CogVideoX's spatial norms condition on them).

The 2B's position table: diffusers builds it for the config's sample size and, at another
size, rebuilds it in place inside forward (`.data[...].copy_()`: tracing exports that
silently wrong, dynamo refuses it); here it is computed once at the export size.
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
from edge.families import FamilyError
from edge.families.cogvideox import NAME
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
from edge.families.pipeline_run import (
    Accepted,
    PipelineModel,
    load_family,
    with_steps,
)
from edge.families.t5 import cut_t5_encoder
from edge.graph.blocks import Block, Chunking
from edge.graph.family_model import Shapes, StorageRule
from edge.graph.lazy_weights import materialized
from edge.models.tdtm import merge_token_frames, pair_first_frames, unmerge_token_frames
from edge.models.video_norm import video_group_norm

COMPONENTS = ("text_encoder", "tokenizer", "transformer", "vae", "scheduler")
GUIDANCE = 6.0            # CogVideoXPipeline's guidance_scale
STEPS = 50
FRAME_BATCH = 2           # latent frames per decoder call (the VAE's num_latent_frames_batch_size)
# a sane bound on the transformer's video tokens: 4x CogVideoX's own 13 x 30 x 45
MAX_TOKENS = 4 * 13 * 30 * 45


# ---------------------------------------------------------------- loading and checks

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


# ---------------------------------------------------------------- transformer blocks

def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' apply_rotary_emb (real pairs, unbound on the last axis) on x (B, H, S, d)
    with tables (S, d)."""
    x_real, x_imag = x.unflatten(-1, (-1, 2)).unbind(-1)
    rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return x * cos + rotated * sin


def joint_attention(attn: nn.Module, x: torch.Tensor, context: torch.Tensor,
                    rope: tuple[torch.Tensor, torch.Tensor] | None,
                    key_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """CogVideoXAttnProcessor2_0 on its weights: attention over [context; x]; RoPE on the
    video tokens joined back by concatenation (diffusers assigns into a slice, which exports
    as ScatterND). `key_bias`: added to each key's logits (TDTM's merged keys). Returns the
    video's and the caption's outputs."""
    length = context.shape[1]
    joint = torch.cat([context, x], dim=1)

    def heads(proj: nn.Module) -> torch.Tensor:
        return proj(joint).unflatten(2, (attn.heads, -1)).transpose(1, 2)

    q, k, v = heads(attn.to_q), heads(attn.to_k), heads(attn.to_v)
    if attn.norm_q is not None:
        q, k = attn.norm_q(q), attn.norm_k(k)
    if rope is not None:
        q = torch.cat([q[:, :, :length], rotary(q[:, :, length:], *rope)], dim=2)
        k = torch.cat([k[:, :, :length], rotary(k[:, :, length:], *rope)], dim=2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_bias).transpose(1, 2).flatten(2)
    out = attn.to_out[1](attn.to_out[0](out))
    return out[:, length:], out[:, :length]


class CogVideoXPrologue(nn.Module):
    """latent (B, F, C, h, w), t in [0, 1] (B,), caption (B, L, text_dim) -> video tokens x
    (B, S, D), caption tokens context (B, L, D), temb (B, E), t_mod (B, 6, D), and for 5B
    the rotary tables cos, sin (S, d). The position tables are parameters, so they are
    stored like weights. t_mod is block 0's modulation (its shift, scale, gate for the video
    and the caption), which the step cache reads to decide whether the blocks must run: its
    linear layer is stored here as well as in block 0 (0.35% of 2B's bytes)."""

    def __init__(self, model: nn.Module, latent_shape: tuple[int, int, int, int],
                 rope: tuple[torch.Tensor, torch.Tensor] | None,
                 num_train_timesteps: int) -> None:
        super().__init__()
        embed = model.patch_embed
        self.time_proj, self.time_embedding = model.time_proj, model.time_embedding
        self.modulation = model.transformer_blocks[0].norm1
        self.text_proj, self.proj = embed.text_proj, embed.proj
        self.n_train = num_train_timesteps
        self.pos = None
        if embed.use_positional_embeddings:
            f, _, h, w = latent_shape
            table = embed._get_positional_embeddings(
                h, w, (f - 1) * embed.temporal_compression_ratio + 1)
            # rows past the caption's: the caption's rows are zeros (adding them is a no-op)
            self.pos = nn.Parameter(table[:, embed.max_text_seq_length:].float().clone(),
                                    requires_grad=False)
        self.rope = None if rope is None else nn.ParameterList(
            [nn.Parameter(r.float().clone(), requires_grad=False) for r in rope])

    def forward(self, latent: torch.Tensor, t: torch.Tensor, caption: torch.Tensor):
        # DDIM's model times are whole training steps as fractions: back to the steps
        temb = self.time_embedding(self.time_proj(torch.round(t * self.n_train)).to(latent.dtype))
        b, f, c, h, w = latent.shape
        x = self.proj(latent.reshape(-1, c, h, w))
        x = x.view(b, f, *x.shape[1:]).flatten(3).transpose(2, 3).flatten(1, 2)
        if self.pos is not None:
            x = x + self.pos
        context = self.text_proj(caption)
        t_mod = self.modulation.linear(self.modulation.silu(temb)).unflatten(1, (6, -1))
        if self.rope is None:
            return x, context, temb, t_mod
        return x, context, temb, t_mod, self.rope[0] * 1, self.rope[1] * 1


class CogVideoXBlockCut(nn.Module):
    """One CogVideoXBlock (diffusers' forward, attention through `joint_attention`)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x, context, temb, rope_cos=None, rope_sin=None):
        b = self.block
        rope = None if rope_cos is None else (rope_cos, rope_sin)
        h, c, gate, c_gate = b.norm1(x, context, temb)
        attn_x, attn_c = joint_attention(b.attn1, h, c, rope)
        x, context = x + gate * attn_x, context + c_gate * attn_c
        h, c, gate, c_gate = b.norm2(x, context, temb)
        length = context.shape[1]
        ff = b.ff(torch.cat([c, h], dim=1))
        return x + gate * ff[:, length:], context + c_gate * ff[:, :length]


class MergedCogVideoXBlock(nn.Module):
    """The TDTM variant of a CogVideoX block (the same modules, so the same weights under the
    same names): the joint attention sees the video tokens of consecutive latent frames
    averaged in pairs (an odd last frame alone), each merged token with the rotary position
    of the first frame of its pair, beside the whole caption; its video output goes back to
    both frames before the residual adds. The feed-forward runs on every token. Attention is
    over [caption; video], so merging halves its video keys and queries. A merged key stands
    for two, so its logits get log 2 (ToMe's proportional attention): without it the caption
    would gain weight against the video, where with its own self-attention apart (Wan) every
    key halves alike. So when each pair of frames is equal the variant equals the block."""

    def __init__(self, block: nn.Module, frames: int, text_tokens: int,
                 tokens_per_frame: int) -> None:
        super().__init__()
        self.block, self.frames = block, frames
        pairs, odd = frames // 2, frames % 2
        self.register_buffer("key_bias", torch.cat([
            torch.zeros(text_tokens), torch.full((pairs * tokens_per_frame,), math.log(2.0)),
            torch.zeros(odd * tokens_per_frame)])[None], persistent=False)  # (1, keys)

    def forward(self, x, context, temb, rope_cos=None, rope_sin=None):
        b = self.block
        rope = None if rope_cos is None else (pair_first_frames(rope_cos, self.frames, axis=0),
                                              pair_first_frames(rope_sin, self.frames, axis=0))
        h, c, gate, c_gate = b.norm1(x, context, temb)
        attn_x, attn_c = joint_attention(b.attn1, merge_token_frames(h, self.frames), c, rope,
                                         self.key_bias)
        x = x + gate * unmerge_token_frames(attn_x, self.frames)
        context = context + c_gate * attn_c
        h, c, gate, c_gate = b.norm2(x, context, temb)
        length = context.shape[1]
        ff = b.ff(torch.cat([c, h], dim=1))
        return x + gate * ff[:, length:], context + c_gate * ff[:, :length]


class CogVideoXEpilogue(nn.Module):
    """video tokens, temb -> velocity (B, F, C, h, w) (a v-prediction for DDIM)."""

    def __init__(self, model: nn.Module, latent_shape: tuple[int, int, int, int]) -> None:
        super().__init__()
        self.norm_final, self.norm_out, self.proj_out = (model.norm_final, model.norm_out,
                                                         model.proj_out)
        self.patch = model.config.patch_size
        self.latent_shape = latent_shape

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        x = self.proj_out(self.norm_out(self.norm_final(x), temb=temb))
        f, c, h, w = self.latent_shape
        p = self.patch
        # (B, F*h'*w', C*p*p) -> (B, F, C, h, w): diffusers reshapes to rank 7; each token's
        # channels are (C, p, p), which pixel_shuffle lays out the same at rank 4 (CoreML
        # takes rank 5 at most)
        x = x.reshape(-1, h // p, w // p, c * p * p).permute(0, 3, 1, 2)
        return F.pixel_shuffle(x, p).reshape(-1, f, c, h, w)


# ---------------------------------------------------------------- VAE decoder stages

# The cache "outputs" of the spatial norms' 1x1x1 convolutions (conv_y, conv_b) are their
# whole inputs, which a kernel of one frame never reads: not carried.
UNREAD_CACHES = ("conv_y", "conv_b")


def cache_paths(cache: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The key paths of the tensors in a diffusers conv_cache dict that a later call reads."""
    paths = []
    for key, value in cache.items():
        if isinstance(value, dict):
            paths += cache_paths(value, (*prefix, key))
        elif key not in UNREAD_CACHES and value is not None:
            paths.append((*prefix, key))
    return paths


def cache_tensors(cache: dict, paths: list[tuple[str, ...]]) -> list[torch.Tensor]:
    out = []
    for path in paths:
        node = cache
        for key in path:
            node = node[key]
        out.append(node)
    return out


def cache_dict(tensors: tuple[torch.Tensor, ...], paths: list[tuple[str, ...]]) -> dict:
    root: dict = {}
    for path, tensor in zip(paths, tensors, strict=True):
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = tensor
    return root


class DecoderStage(nn.Module):
    """One stage of the decoder on one call's frames: (x, [zq,] *caches) -> (x, [zq,]
    *new caches), the caches flattened in `paths` order (the head makes zq, the later
    stages take it). `first`: the first call's stage, no cache in. `run(parts, x, zq,
    cache)` is the diffusers computation, giving its outputs and then its cache dict."""

    def __init__(self, run: Callable, parts: dict[str, nn.Module], first: bool,
                 takes_zq: bool) -> None:
        super().__init__()
        self.run, self.parts = run, nn.ModuleDict(parts)
        self.first, self.takes_zq = first, takes_zq
        self.paths: list[tuple[str, ...]] | None = None

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        zq, caches = (rest[0], rest[1:]) if self.takes_zq else (None, rest)
        cache = None if self.first else cache_dict(caches, self.paths)
        *out, new = self.run(self.parts, x, zq, cache)
        if self.paths is None:  # the first call, traced first: what later calls will read
            self.paths = cache_paths(new)
        return (*out, *cache_tensors(new, self.paths))


def nearest_up_2d(x: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, C, 2H, 2W), nearest."""
    return F.interpolate(x, scale_factor=2.0)


def nearest_up_3d(x: torch.Tensor) -> torch.Tensor:
    """(B, C, T, H, W) -> (B, C, 2T, 2H, 2W), as nearest 3D upsampling by 2 gives it, at rank
    5 at most: each frame repeated in time through a broadcast, then a 2D nearest (CoreML has
    no upsample_nearest3d)."""
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t, 1, h * w).expand(b, c, t, 2, h * w).reshape(b, c * 2 * t, h, w)
    return nearest_up_2d(x).reshape(b, c, 2 * t, 2 * h, 2 * w)


def nearest_resize(z: torch.Tensor, size: tuple[int, int, int]) -> torch.Tensor:
    """F.interpolate(z, size) (nearest) for a size each of whose sides is a whole multiple of
    z's, as the decoder's spatial norms always ask: each cell repeated, at rank 5 at most
    (CoreML has no upsample_nearest3d). Nearest at a ratio of k picks source cell i // k."""
    b, c, t, h, w = z.shape
    k_t, k_h, k_w = (n // m for n, m in zip(size, (t, h, w), strict=True))
    if (k_t * t, k_h * h, k_w * w) != tuple(size):
        raise ValueError(f"nearest_resize: {tuple(size)} is not a whole multiple of "
                         f"{(t, h, w)}")
    if k_t > 1:
        z = z.reshape(b, c, t, 1, h * w).expand(b, c, t, k_t, h * w).reshape(b, c, t * k_t, h, w)
    if k_h > 1 or k_w > 1:  # a 2D nearest over the frames, joined to the channels
        z = F.interpolate(z.reshape(b, c * t * k_t, h, w), scale_factor=(float(k_h), float(k_w)))
        z = z.reshape(b, c, t * k_t, h * k_h, w * k_w)
    return z


class FlatGroupNorm(nn.Module):
    """diffusers' GroupNorm of (B, C, T, H, W) through rank 4 (edge/models/video_norm.py),
    its parameters keeping the norm's names."""

    def __init__(self, norm: nn.GroupNorm) -> None:
        super().__init__()
        self.weight, self.bias = norm.weight, norm.bias
        self.groups, self.eps = norm.num_groups, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return video_group_norm(x, self.groups, self.weight, self.bias, self.eps)


class GraphFriendlySpatialNorm(nn.Module):
    """CogVideoXSpatialNorm3D (the same modules, so the same weights) with its resize of the
    latents written by `nearest_resize` and its group norm at rank 4 (`FlatGroupNorm`);
    equal to diffusers' (tested)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm_layer = FlatGroupNorm(norm.norm_layer)
        self.conv_y, self.conv_b = norm.conv_y, norm.conv_b

    def forward(self, f: torch.Tensor, zq: torch.Tensor, conv_cache: dict | None = None):
        conv_cache, new = conv_cache or {}, {}
        t = f.shape[2]
        if t > 1 and t % 2 == 1:  # an odd call's first frame is resized apart
            zq = torch.cat([nearest_resize(zq[:, :, :1], (1, *f.shape[-2:])),
                            nearest_resize(zq[:, :, 1:], (t - 1, *f.shape[-2:]))], dim=2)
        else:
            zq = nearest_resize(zq, tuple(f.shape[-3:]))
        conv_y, new["conv_y"] = self.conv_y(zq, conv_cache=conv_cache.get("conv_y"))
        conv_b, new["conv_b"] = self.conv_b(zq, conv_cache=conv_cache.get("conv_b"))
        return self.norm_layer(f) * conv_y + conv_b, new


class GraphFriendlyResnet(nn.Module):
    """CogVideoXResnetBlock3D's forward (decoder: spatial norms, no time embedding) with its
    norms graph friendly; the parameter names stay diffusers'."""

    def __init__(self, resnet: nn.Module) -> None:
        super().__init__()
        self.norm1 = GraphFriendlySpatialNorm(resnet.norm1)
        self.norm2 = GraphFriendlySpatialNorm(resnet.norm2)
        self.conv1, self.conv2 = resnet.conv1, resnet.conv2
        self.nonlinearity = resnet.nonlinearity
        self.conv_shortcut = getattr(resnet, "conv_shortcut", None)
        self.cached_shortcut = resnet.use_conv_shortcut  # a causal conv with a cache

    def forward(self, x, temb, zq, conv_cache=None):
        conv_cache, new = conv_cache or {}, {}
        h, new["norm1"] = self.norm1(x, zq, conv_cache=conv_cache.get("norm1"))
        h, new["conv1"] = self.conv1(self.nonlinearity(h), conv_cache=conv_cache.get("conv1"))
        h, new["norm2"] = self.norm2(h, zq, conv_cache=conv_cache.get("norm2"))
        h, new["conv2"] = self.conv2(self.nonlinearity(h), conv_cache=conv_cache.get("conv2"))
        if self.conv_shortcut is not None and self.cached_shortcut:
            x, new["conv_shortcut"] = self.conv_shortcut(
                x, conv_cache=conv_cache.get("conv_shortcut"))
        elif self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return h + x, new


class GraphFriendlyMidBlock(nn.Module):
    """CogVideoXMidBlock3D's forward on graph-friendly resnets."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([GraphFriendlyResnet(r) for r in block.resnets])

    def forward(self, h, temb, zq, conv_cache=None):
        conv_cache, new = conv_cache or {}, {}
        for i, resnet in enumerate(self.resnets):
            h, new[f"resnet_{i}"] = resnet(h, temb, zq, conv_cache=conv_cache.get(f"resnet_{i}"))
        return h, new


class GraphFriendlyUpsample(nn.Module):
    """CogVideoXUpsample3D (the same conv, so the same weights) with its interpolations
    written at rank 5 at most (`nearest_up_3d`); equal to diffusers' (tested)."""

    def __init__(self, upsample: nn.Module) -> None:
        super().__init__()
        self.conv, self.compress_time = upsample.conv, upsample.compress_time

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        if self.compress_time and t > 1 and t % 2 == 1:  # the first frame doubles in space only
            first = nearest_up_2d(x[:, :, 0])[:, :, None]
            x = torch.cat([first, nearest_up_3d(x[:, :, 1:])], dim=2)
        elif self.compress_time and t > 1:
            x = nearest_up_3d(x)
        else:  # one frame, or no time compression: every frame in space only
            x = nearest_up_2d(x.transpose(1, 2).reshape(b * t, c, h, w))
            x = x.reshape(b, t, c, 2 * h, 2 * w).transpose(1, 2)
        b, c, t, h, w = x.shape
        x = self.conv(x.transpose(1, 2).reshape(b * t, c, h, w))
        return x.reshape(b, t, *x.shape[1:]).transpose(1, 2)


class GraphFriendlyUpBlock(nn.Module):
    """CogVideoXUpBlock3D's forward on graph-friendly resnets and upsampler (the parameter
    names stay diffusers')."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([GraphFriendlyResnet(r) for r in block.resnets])
        self.upsamplers = None if block.upsamplers is None else nn.ModuleList(
            [GraphFriendlyUpsample(u) for u in block.upsamplers])

    def forward(self, h, temb, zq, conv_cache=None):
        conv_cache, new = conv_cache or {}, {}
        for i, resnet in enumerate(self.resnets):
            h, new[f"resnet_{i}"] = resnet(h, temb, zq, conv_cache=conv_cache.get(f"resnet_{i}"))
        for upsampler in self.upsamplers or ():
            h = upsampler(h)
        return h, new


def decoder_stages(vae: nn.Module, first: bool) -> list[tuple[str, DecoderStage]]:
    """(name, stage) pairs of the decoder for one call of latents (B, f, C, h, w) as the
    sampler makes them. The head gives zq, the call's latents in the decoder's layout and
    scale, which every stage's spatial norms take."""
    dec, scale = vae.decoder, vae.config.scaling_factor

    def head(parts, z, _, cache):
        zq = z.permute(0, 2, 1, 3, 4) / scale
        if "post_quant_conv" in parts:
            zq = parts["post_quant_conv"](zq)
        cache = cache or {}
        h, conv_in = parts["conv_in"](zq, conv_cache=cache.get("conv_in"))
        h, mid = parts["mid_block"](h, None, zq, conv_cache=cache.get("mid_block"))
        return h, zq, {"conv_in": conv_in, "mid_block": mid}

    def up(parts, h, zq, cache):
        return parts["up"](h, None, zq, conv_cache=cache)

    def out(parts, h, zq, cache):
        cache = cache or {}
        h, norm = parts["norm_out"](h, zq, conv_cache=cache.get("norm_out"))
        h, conv = parts["conv_out"](parts["act"](h), conv_cache=cache.get("conv_out"))
        # VideoProcessor.postprocess_video's denormalisation, in its order
        return (h / 2 + 0.5).clamp(0, 1), {"norm_out": norm, "conv_out": conv}

    head_parts = {"conv_in": dec.conv_in, "mid_block": GraphFriendlyMidBlock(dec.mid_block)}
    if vae.post_quant_conv is not None:
        head_parts["post_quant_conv"] = vae.post_quant_conv
    stages = [("head", DecoderStage(head, head_parts, first, takes_zq=False))]
    stages += [(f"up_{i}", DecoderStage(up, {"up": GraphFriendlyUpBlock(block)}, first,
                                        takes_zq=True))
               for i, block in enumerate(dec.up_blocks)]
    stages.append(("out", DecoderStage(out, {"norm_out": GraphFriendlySpatialNorm(dec.norm_out),
                                             "act": dec.conv_act,
                                             "conv_out": dec.conv_out}, first, takes_zq=True)))
    return stages


def first_call_frames(latent_frames: int) -> int:
    """Latent frames of diffusers' first decoder call: two, plus an odd count's extra one
    (fewer when there are fewer)."""
    if latent_frames < FRAME_BATCH:
        return latent_frames
    return FRAME_BATCH + latent_frames % FRAME_BATCH


# ---------------------------------------------------------------- the family's model

@dataclass
class CogVideoXModel(PipelineModel):
    pipe: object                    # diffusers CogVideoXPipeline, float32
    folder: Path
    height: int
    width: int
    frames: int
    sampler: SamplerSettings
    notes: list[str]
    name: str = NAME
    family: str = NAME
    chunked: dict[str, Chunking] = field(default_factory=dict)
    device_storage: dict[str, StorageRule] = field(default_factory=dict)
    out_of_core: bool = False  # weights read block by block (edge/graph/lazy_weights.py)

    def __post_init__(self) -> None:
        self.chunked = {"vae_decoder": Chunking(
            input="z", output="frames", axis=1, size=FRAME_BATCH, first_variant="first",
            first_size=first_call_frames(self.latent_shape[0]), output_axis=2)}

    @property
    def text_tokens(self) -> int:
        return self.pipe.transformer.config.max_text_seq_length

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        pipe = self.pipe
        return ((self.frames - 1) // pipe.vae_scale_factor_temporal + 1,
                pipe.transformer.config.in_channels,
                self.height // pipe.vae_scale_factor_spatial,
                self.width // pipe.vae_scale_factor_spatial)

    def _ids(self, prompts: list[str]) -> torch.Tensor:
        return self.pipe.tokenizer(prompts, padding="max_length", max_length=self.text_tokens,
                                   truncation=True, add_special_tokens=True,
                                   return_tensors="pt").input_ids

    def cut(self, shapes: Shapes | None = None) -> dict[str, list[Block]]:
        shapes = shapes or self.shapes("onnx")
        ids = self._ids(["a red circle moving left", "the dog"][:shapes.prompts])
        return {"text_encoder": cut_t5_encoder(self.pipe.text_encoder.encoder, ids),
                "transformer": self._cut_transformer(shapes.guidance_batch),
                "vae_decoder": self._cut_vae_decoder(shapes.videos)}

    def _rope(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.pipe.transformer.config.use_rotary_positional_embeddings:
            return None
        return self.pipe._prepare_rotary_positional_embeddings(
            self.height, self.width, self.latent_shape[0], torch.device("cpu"))

    def _cut_transformer(self, batch: int) -> list[Block]:
        model = self.pipe.transformer
        g = torch.Generator().manual_seed(0)
        latent = torch.randn(batch, *self.latent_shape, generator=g)
        t = torch.randint(0, self.sampler.num_train_timesteps, (batch,), generator=g).float()
        t = t / self.sampler.num_train_timesteps
        caption = torch.randn(batch, self.text_tokens, model.config.text_embed_dim, generator=g)
        rope = self._rope()
        pro_out = ["x", "context", "temb", "t_mod"] + ([] if rope is None
                                                       else ["rope_cos", "rope_sin"])
        pro = Block("transformer", "prologue",
                    CogVideoXPrologue(model, self.latent_shape, rope,
                                      self.sampler.num_train_timesteps).eval(),
                    ["latent", "t", "caption"], pro_out, (latent, t, caption), [True] * 3,
                    dynamic_outputs=[True] * 4 + [False] * (len(pro_out) - 4))
        feeds = dict(zip(pro_out, pro.run(*pro.example), strict=True))
        blocks = [pro]
        block_in = ["x", "context", "temb"] + pro_out[4:]
        frames = self.latent_shape[0]
        # blocks take the prologue's activations as stand-ins (Block.chained), made real
        # by edge.graph.blocks.chained as the exporters run them: the cut runs no block
        for i, b in enumerate(model.transformer_blocks):
            merged = MergedCogVideoXBlock(b, frames, self.text_tokens,
                                          feeds["x"].shape[1] // frames)
            variants = {"tdtm": merged.eval()} if frames > 1 else {}
            blocks.append(Block("transformer", f"block_{i}", CogVideoXBlockCut(b).eval(),
                                block_in, ["x", "context"], tuple(feeds[n] for n in block_in),
                                [True] * 3 + [False] * (len(block_in) - 3), variants,
                                chained=("x", "context")))
        blocks.append(Block("transformer", "epilogue",
                            CogVideoXEpilogue(model, self.latent_shape).eval(), ["x", "temb"],
                            ["velocity"], (feeds["x"], feeds["temb"]), [True, True],
                            chained=("x",)))
        return blocks

    def _cut_vae_decoder(self, videos: int) -> list[Block]:
        """One block per stage, run once per decoder call (`chunked`); its variant "first" is
        the first call's. `videos`: the batch traced."""
        g = torch.Generator().manual_seed(1)
        z = torch.randn(videos, *self.latent_shape, generator=g)
        first_frames = self.chunked["vae_decoder"].first_size
        first_x = z[:, :first_frames]
        # a later call's frames; a video with none still gets its later graphs, traced on a
        # stand-in call of the first frames repeated
        x = z[:, first_frames:first_frames + FRAME_BATCH]
        if x.shape[1] < FRAME_BATCH:
            x = first_x[:, :1].repeat(1, FRAME_BATCH, 1, 1, 1)
        firsts = dict(decoder_stages(self.pipe.vae, first=True))
        blocks = []
        first_zq = zq = None  # the head makes them
        for i, (name, stage) in enumerate(decoder_stages(self.pipe.vae, first=False)):
            first_stage = firsts[name]
            ins = ["z" if i == 0 else "h"] + (["zq"] if stage.takes_zq else [])
            first_in = (first_x, first_zq) if stage.takes_zq else (first_x,)
            later_in = (x, zq) if stage.takes_zq else (x,)
            with torch.no_grad(), materialized(stage), materialized(first_stage):
                first_out = first_stage(*first_in)
                stage.paths = first_stage.paths
                made = len(first_out) - len(stage.paths)  # tensors before the caches
                out = stage(*later_in, *first_out[made:])
            state = [f"{name}_cache_{k}" for k in range(len(stage.paths))]
            outs = ["frames" if name == "out" else "h"] + (["zq"] if made == 2 else [])
            first = Block("vae_decoder", name, first_stage.eval(), ins, outs + state, first_in,
                          [True] * len(ins))
            blocks.append(Block("vae_decoder", name, stage.eval(), ins + state, outs + state,
                                later_in + tuple(first_out[made:]),
                                [True] * (len(ins) + len(state)), {"first": first}))
            if made == 2:
                first_zq, zq = first_out[1], out[1]
            first_x, x = first_out[0], out[0]
        return blocks

    def pipeline_options(self, seed: int | None,
                         dynamic_guidance: bool | None = None) -> dict:
        """`reference(..., dynamic_guidance=)`: CogVideoXPipeline's use_dynamic_cfg (default:
        the sampler's setting)."""
        return {"use_dynamic_cfg": self.sampler.dynamic_guidance if dynamic_guidance is None
                else dynamic_guidance}


def check_size(folder: Path) -> dict[str, int]:
    """The small size an export's end-to-end check may run at (`--check small`): a few
    latent frames, two patches a side."""
    shapes = check_components(folder)
    side = 2 * shapes.spatial * shapes.patch
    return {"height": side, "width": side, "frames": 2 * shapes.temporal + 1}


def accepts(folder: Path, height: int | None = None, width: int | None = None,
            frames: int | None = None, steps: int | None = None,
            sigmas: tuple[float, ...] | None = None) -> Accepted:
    """What this family takes, from the folder's JSON files alone (nothing loaded): every
    component, the components against each other, the scheduler as edge's sampler, the
    video size (default: the transformer's own) against the model. Refuses anything else
    with a FamilyError naming the file, field or option."""
    check_folder(folder)
    shapes = check_components(folder)
    given = {"height": height, "width": width, "frames": frames}
    size = {k: own if v is None else v for (k, v), own in zip(given.items(), shapes.sample,
                                                              strict=True)}
    check_video_size(shapes, **size)
    sampler = sampler_settings(folder / "scheduler" / "scheduler_config.json")
    return Accepted(size, with_steps(sampler, steps, sigmas))


def load(folder: Path, out_of_core: bool | None = None, **options) -> CogVideoXModel:
    """The folder's CogVideoXPipeline as an edge model; `options`: what `accepts` takes.
    `out_of_core`: build the models without weights and read each block's when it is
    exported (default: when the float32 weights exceed half this machine's memory)."""
    return load_family(folder, accepts, load_pipeline, CogVideoXModel, out_of_core, **options)
