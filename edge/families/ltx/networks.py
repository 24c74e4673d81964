"""LTX-Video's networks rewritten to cut and trace: the transformer's prologue, blocks (and
their temporal-token-merged variant) and epilogue, and the video VAE decoder's stages as
graph-friendly modules (edge/families/ltx/family.py cuts with them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edge.models.tdtm import merge_token_frames, pair_first_frames, unmerge_token_frames

CAPTION_BIAS = -10000.0    # LTXVideoTransformer3DModel's bias on masked caption tokens


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


