"""Open-Sora 1.2's transformer, STDiT3, written from its architecture and loading the released
checkpoint (`hpcai-tech/OpenSora-STDiT-v3`: config.json + model.safetensors) by its own key
names: every module below is named as the checkpoint names it.

  embedding   3D patches (Conv3d), a 2D sin-cos position table computed from the pixel size
              (no weights), the timestep plus the frame rate embedded (`t`), its six
              modulations (`t_block`), the caption projected (`y_embedder`)
  blocks      depth x (spatial block, temporal block): adaLN-single modulation, self-attention
              with RMS-normed queries and keys (rotary positions in the temporal block only,
              interleaved pairs, over latent frames), cross-attention to the caption under its
              mask (no norm, no gate), a GELU-tanh MLP
  final       modulated norm by `t` itself (no SiLU), linear, unpatchify

The model predicts x0 - noise on its first `in_channels` output channels (the rest is the
learned variance, unused at inference), told the time on Open-Sora's 0..1000 scale. The
caption's mask turns into an additive bias of -inf on the cross-attention's padding keys:
Open-Sora packs the valid tokens of every sample and attends block-diagonally, which is the
same attention. (Not a finite bias such as -1e4: random or unusual weights give logits past
it, and padding leaks; a caption always has a token, its end mark, so no row is all -inf.)

TDTM (`merged`, On-device Sora's temporal token merging): in each block the self- and
cross-attention run on the mean of each pair of consecutive latent frames, their outputs
copied back to both frames before the residual adds; the temporal attention's rotary
positions are the first frame's of each pair; the MLP stays per frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edge.models.tdtm import merge_token_frames, merged_frames, unmerge_token_frames


@dataclass(frozen=True)
class STDiT3Config:
    """The fields of a released STDiT3 config.json that shape the model."""

    depth: int = 28
    hidden_size: int = 1152
    num_heads: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    in_channels: int = 4
    caption_channels: int = 4096
    model_max_length: int = 300
    mlp_ratio: float = 4.0
    qk_norm: bool = True
    pred_sigma: bool = True
    input_sq_size: int = 512

    @property
    def out_channels(self) -> int:
        return 2 * self.in_channels if self.pred_sigma else self.in_channels

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def sinusoid(values: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """Open-Sora's timestep (and frame rate) embedding: cos then sin of value x frequencies
    exp(-ln(max_period) k / (dim/2)), in float32: (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32,
                                                           device=values.device) / half)
    args = values.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def position_table(rows: int, cols: int, dim: int, height: float, width: float,
                   input_sq_size: int) -> torch.Tensor:
    """The 2D sin-cos position table (rows*cols, dim) of one frame's patches: coordinates
    index / scale * (base_size / side), scale = sqrt(height*width) / input_sq_size (pixels),
    base_size = round(sqrt(rows*cols)); the column's sin and cos first, then the row's."""
    scale = math.sqrt(height * width) / input_sq_size
    base_size = round(math.sqrt(rows * cols))
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim // 2, 2).float() / (dim // 2)))
    grid_r = torch.arange(rows, dtype=torch.float32) / scale * (base_size / rows)
    grid_c = torch.arange(cols, dtype=torch.float32) / scale * (base_size / cols)
    r, c = torch.meshgrid(grid_r, grid_c, indexing="ij")

    def sin_cos(coords: torch.Tensor) -> torch.Tensor:
        args = coords.reshape(-1)[:, None] * inv_freq[None]
        return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)

    return torch.cat([sin_cos(c), sin_cos(r)], dim=-1)


def caption_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cross-attention's additive bias of a caption mask (B, L): 0 on a token, -inf on
    padding (the module's docstring says why not a finite value)."""
    return torch.zeros_like(mask, dtype=dtype).masked_fill(mask == 0, float("-inf"))


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on interleaved feature pairs (2k, 2k+1) of x (..., n, d), by tables
    (n, d) whose pair entries repeat the angle."""
    pairs = x.unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return x * cos + rotated * sin


def rotary_tables(freqs: torch.Tensor, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (frames, head_dim) of the temporal attention's positions 0..frames-1."""
    angles = torch.arange(frames, dtype=freqs.dtype, device=freqs.device)[:, None] * freqs[None]
    angles = angles.repeat_interleave(2, dim=-1)
    return angles.cos(), angles.sin()


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class SelfAttention(nn.Module):
    def __init__(self, cfg: STDiT3Config) -> None:
        super().__init__()
        dim, self.heads = cfg.hidden_size, cfg.num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        norm = (lambda: RMSNorm(cfg.head_dim)) if cfg.qk_norm else nn.Identity
        self.q_norm, self.k_norm = norm(), norm()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rotate_interleaved(q, *rope), rotate_interleaved(k, *rope)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).flatten(2))


class CrossAttention(nn.Module):
    def __init__(self, cfg: STDiT3Config) -> None:
        super().__init__()
        dim, self.heads = cfg.hidden_size, cfg.num_heads
        self.q_linear = nn.Linear(dim, dim)
        self.kv_linear = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, y: torch.Tensor, y_bias: torch.Tensor) -> torch.Tensor:
        """x (B, N, C) attends to its own caption y (B, L, C); y_bias (B, L): 0 on a caption
        token, -inf on padding."""
        q = self.q_linear(x).unflatten(-1, (self.heads, -1)).transpose(1, 2)
        k, v = self.kv_linear(y).unflatten(-1, (2, self.heads, -1)).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=y_bias[:, None, None, :])
        return self.proj(out.transpose(1, 2).flatten(2))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, out: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class STDiT3Block(nn.Module):
    """A spatial block (attention within each frame) or a temporal one (attention across
    the frames at each place, with rotary positions). x (B, T*S, C), tokens frame-major."""

    def __init__(self, cfg: STDiT3Config, temporal: bool) -> None:
        super().__init__()
        dim = cfg.hidden_size
        self.temporal = temporal
        self.attn = SelfAttention(cfg)
        self.cross_attn = CrossAttention(cfg)
        self.mlp = Mlp(dim, int(dim * cfg.mlp_ratio), dim)
        self.scale_shift_table = nn.Parameter(torch.zeros(6, dim))
        self.eps = 1e-6

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], eps=self.eps)

    def forward(self, x: torch.Tensor, t_mlp: torch.Tensor, y: torch.Tensor,
                y_bias: torch.Tensor, frames: int,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                merged: bool = False) -> torch.Tensor:
        """`rope`: the temporal attention's tables for all `frames`; `merged`: TDTM (the
        module's docstring)."""
        b, n, c = x.shape
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            self.scale_shift_table[None] + t_mlp.reshape(b, 6, c)).chunk(6, dim=1)
        h = self.norm(x) * (1 + scale_msa) + shift_msa
        if merged:
            h = merge_token_frames(h, frames)
            rope = None if rope is None else (rope[0][::2], rope[1][::2])
        h = self.self_attention(h, merged_frames(frames) if merged else frames, rope)
        x = x + gate_msa * (unmerge_token_frames(h, frames) if merged else h)
        if merged:
            x = x + unmerge_token_frames(
                self.cross_attn(merge_token_frames(x, frames), y, y_bias), frames)
        else:
            x = x + self.cross_attn(x, y, y_bias)
        h = self.norm(x) * (1 + scale_mlp) + shift_mlp
        return x + gate_mlp * self.mlp(h)

    def self_attention(self, h: torch.Tensor, frames: int,
                       rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, n, c = h.shape
        if self.temporal:  # (B, T*S, C) -> (B*S, T, C)
            h = h.reshape(b, frames, -1, c).transpose(1, 2).reshape(-1, frames, c)
            h = self.attn(h, rope)
            return h.reshape(b, -1, frames, c).transpose(1, 2).reshape(b, n, c)
        return self.attn(h.reshape(b * frames, -1, c)).reshape(b, n, c)  # (B*T, S, C)


class TimestepEmbedder(nn.Module):
    """A value (time on 0..1000, or frames per second) -> (B, C): sinusoid then an MLP."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(256, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        # the sinusoid in float32 whatever the MLP's dtype (a half-precision t*1000 is 0.5
        # apart near 1000), then cast to it, as Open-Sora does
        return self.mlp(sinusoid(values).to(self.mlp[0].weight.dtype))


class PatchEmbed(nn.Module):
    def __init__(self, cfg: STDiT3Config) -> None:
        super().__init__()
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, cfg.patch_size,
                              stride=cfg.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # token (t*H + h)*W + w


class CaptionEmbedder(nn.Module):
    def __init__(self, cfg: STDiT3Config) -> None:
        super().__init__()
        self.y_proj = Mlp(cfg.caption_channels, cfg.hidden_size, cfg.hidden_size)
        # the learned null caption, in the text encoder's space (guidance's other half)
        self.register_buffer("y_embedding",
                             torch.zeros(cfg.model_max_length, cfg.caption_channels))


class FinalLayer(nn.Module):
    def __init__(self, cfg: STDiT3Config) -> None:
        super().__init__()
        dim = cfg.hidden_size
        self.scale_shift_table = nn.Parameter(torch.zeros(2, dim))
        self.linear = nn.Linear(dim, math.prod(cfg.patch_size) * cfg.out_channels)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.scale_shift_table[None] + t[:, None]).chunk(2, dim=1)
        x = F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale) + shift
        return self.linear(x)


class Rope(nn.Module):
    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.register_buffer("freqs", 1.0 / 10000 ** (
            torch.arange(0, head_dim, 2).float() / head_dim))


class STDiT3(nn.Module):
    def __init__(self, cfg: STDiT3Config) -> None:
        super().__init__()
        self.cfg = cfg
        dim = cfg.hidden_size
        self.x_embedder = PatchEmbed(cfg)
        self.t_embedder = TimestepEmbedder(dim)
        self.fps_embedder = TimestepEmbedder(dim)
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.y_embedder = CaptionEmbedder(cfg)
        self.spatial_blocks = nn.ModuleList(STDiT3Block(cfg, False) for _ in range(cfg.depth))
        self.temporal_blocks = nn.ModuleList(STDiT3Block(cfg, True) for _ in range(cfg.depth))
        self.final_layer = FinalLayer(cfg)
        self.rope = Rope(cfg.head_dim)

    def grid(self, latent_shape: tuple[int, ...]) -> tuple[int, int, int]:
        """Patches (frames, rows, columns) of latents (..., T, h, w)."""
        return tuple(n // p for n, p in zip(latent_shape[-3:], self.cfg.patch_size, strict=True))

    def embed_time(self, timestep: torch.Tensor, fps: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """t (B, C): the time (0..1000) and the frame rate embedded; t_mlp (B, 6C)."""
        t = self.t_embedder(timestep) + self.fps_embedder(fps)
        return t, self.t_block(t)

    def embed_caption(self, y: torch.Tensor, mask: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """caption (B, L, caption channels), mask (B, L) -> projected caption (B, L, C) and
        its keys' additive bias (B, L): 0 on a token, -inf on padding."""
        return self.y_embedder.y_proj(y), caption_bias(mask, y.dtype)

    def embed_video(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """latents (B, Cin, T, h, w) -> tokens (B, T*S, C), the frame's position table added."""
        b = x.shape[0]
        frames = self.grid(x.shape)[0]
        tokens = self.x_embedder(x).reshape(b, frames, -1, self.cfg.hidden_size) + pos
        return tokens.flatten(1, 2)

    def unpatchify(self, x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """(B, N, prod(patch) * Cout), each token's channels (pt, ph, pw, Cout) -> latents
        (B, Cout, T*pt, H*ph, W*pw)."""
        (t, h, w), (pt, ph, pw) = grid, self.cfg.patch_size
        x = x.reshape(x.shape[0], t, h, w, pt, ph, pw, -1)
        return x.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(x.shape[0], -1, t * pt, h * ph, w * pw)

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, y: torch.Tensor,
                mask: torch.Tensor, fps: torch.Tensor, height: float,
                width: float) -> torch.Tensor:
        """latents x (B, Cin, T, h, w), timestep (B,) on 0..1000, caption y (B, L, Ct) and its
        mask (B, L), fps (B,), the video's pixel height and width -> (B, Cout, T, h, w)."""
        grid = self.grid(x.shape)
        pos = position_table(grid[1], grid[2], self.cfg.hidden_size, height, width,
                             self.cfg.input_sq_size).to(x.device)  # the reference may be on a GPU
        tokens = self.embed_video(x, pos)
        t, t_mlp = self.embed_time(timestep, fps)
        y, y_bias = self.embed_caption(y, mask)
        rope = rotary_tables(self.rope.freqs, grid[0])
        for spatial, temporal in zip(self.spatial_blocks, self.temporal_blocks, strict=True):
            tokens = spatial(tokens, t_mlp, y, y_bias, grid[0])
            tokens = temporal(tokens, t_mlp, y, y_bias, grid[0], rope)
        return self.unpatchify(self.final_layer(tokens, t), grid)
