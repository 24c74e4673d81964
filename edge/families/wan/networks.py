"""Wan's networks rewritten to cut and trace: the transformer's prologue, blocks (and their
temporal-token-merged variant) and epilogue, and the causal VAE decoder as graph-friendly
stages that take and give their feature caches (edge/families/wan/family.py cuts with them)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from edge.graph.reference_device import on_device_of
from edge.models.tdtm import merge_token_frames, pair_first_frames, unmerge_token_frames

TIMESTEP_SCALE = 1000.0   # the transformer takes timesteps in training steps
CACHE_FRAMES = 2          # frames each causal convolution of the VAE keeps (diffusers' CACHE_T)


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


