"""CogVideoX's networks rewritten to cut and trace: the transformer's prologue, joint-attention
blocks (and their temporal-token-merged variant) and epilogue, and the VAE decoder's stages
with their caches as explicit inputs and outputs (edge/families/cogvideox/family.py cuts with
them)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from edge.models.tdtm import merge_token_frames, pair_first_frames, unmerge_token_frames
from edge.models.video_norm import video_group_norm

FRAME_BATCH = 2           # latent frames per decoder call (the VAE's num_latent_frames_batch_size)


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


