"""tiny-sora's transformer: a small STDiT (spatial-temporal diffusion transformer).

Structure follows Open-Sora's STDiT3 at toy scale:
  prologue  3D patch embedding (1x2x2) + fixed spatial/temporal position encodings,
            timestep embedding (plus pooled caption) -> one shared adaLN-single modulation,
            caption projection
  pairs     N x (spatial self-attention block, temporal self-attention block); every block
            also cross-attends to the caption tokens; attention uses qk-norm
  epilogue  modulated norm + linear, unpatchify back to the latent shape

Each stage is a module with named tensor inputs and outputs, so exporters can cut the model
block by block: prologue -> pair_0 .. pair_{N-1} -> epilogue. The model predicts the
rectified-flow velocity v = noise - x0 (diffusers' convention).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edge.graph.feed_forward import feed_forward_kind
from edge.models.tdtm import merge_frames, unmerge_frames


@dataclass(frozen=True)
class STDiTConfig:
    in_channels: int = 4          # VAE latent channels
    frames: int = 16              # latent frames (the VAE is per frame)
    latent_size: int = 8          # latent height = width
    patch: int = 2                # spatial patch; temporal patch is 1
    hidden: int = 128
    heads: int = 4
    pairs: int = 4                # spatial/temporal block pairs
    mlp_ratio: float = 4.0
    caption_dim: int = 384        # MiniLM hidden size
    caption_len: int = 16         # caption tokens (padded)

    @property
    def tokens_per_frame(self) -> int:
        return (self.latent_size // self.patch) ** 2

    def to_dict(self) -> dict:
        return asdict(self)


def sincos_1d(positions: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Transformer sinusoidal encoding of float positions: (N,) -> (N, dim), with
    wavelengths from 2*pi up to 2*pi*max_period."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32,
                                                           device=positions.device) / half)
    args = positions.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def sincos_2d(grid: int, dim: int, max_period: float) -> torch.Tensor:
    """(grid*grid, dim): half the channels encode the row, half the column."""
    ys, xs = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    return torch.cat([sincos_1d(ys.flatten(), dim // 2, max_period),
                      sincos_1d(xs.flatten(), dim // 2, max_period)], -1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class Attention(nn.Module):
    """Multi-head attention; self-attention when `context` is None. qk-norm (RMSNorm per head)
    keeps attention logits bounded, which Open-Sora found necessary for stable training."""

    def __init__(self, dim: int, heads: int, context_dim: int | None = None) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(context_dim or dim, 2 * dim)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        b, n, d = x.shape
        context = x if context is None else context
        q = self.q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(context).view(b, -1, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


@feed_forward_kind(lambda m: m[0].out_features)  # its widening Linear's width
class Mlp(nn.Sequential):
    def __init__(self, dim: int, ratio: float) -> None:
        hidden = int(dim * ratio)
        super().__init__(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"),
                         nn.Linear(hidden, dim))


class STBlock(nn.Module):
    """One transformer block attending along space (within a frame) or along time (across
    frames at one spatial position), then to the caption, then an MLP. Timestep modulation
    comes in as `t_mod` (adaLN-single) plus this block's learned table."""

    def __init__(self, cfg: STDiTConfig, temporal: bool) -> None:
        super().__init__()
        d = cfg.hidden
        self.temporal = temporal
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(d, cfg.heads)
        self.cross_attn = Attention(d, cfg.heads, context_dim=d)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(d, cfg.mlp_ratio)
        self.scale_shift_table = nn.Parameter(torch.randn(6, d) / d**0.5)

    def forward(self, x: torch.Tensor, t_mod: torch.Tensor, y: torch.Tensor,
                y_bias: torch.Tensor, merged: bool = False) -> torch.Tensor:
        """x (B, T, S, D); t_mod (B, 6, D); y (B, L, D); y_bias (B, 1, 1, L) additive mask.

        merged: temporal token merging (TDTM) — self- and cross-attention run on the mean of
        each pair of consecutive frames and their outputs are copied back to both frames
        before the residual add; the MLP stays per frame."""
        frames = x.shape[1]
        shift1, scale1, gate1, shift2, scale2, gate2 = (
            self.scale_shift_table[None] + t_mod)[:, :, None, None].unbind(1)  # each (B, 1, 1, D)
        h = modulate(self.norm1(x), shift1, scale1)
        if merged:
            h = unmerge_frames(self._self_attention(merge_frames(h)), frames)
        else:
            h = self._self_attention(h)
        x = x + gate1 * h
        if merged:
            x = x + unmerge_frames(self._cross_attention(merge_frames(x), y, y_bias), frames)
        else:
            x = x + self._cross_attention(x, y, y_bias)
        return x + gate2 * self.mlp(modulate(self.norm2(x), shift2, scale2))

    def _self_attention(self, h: torch.Tensor) -> torch.Tensor:
        b, t, s, d = h.shape
        if self.temporal:
            h = h.transpose(1, 2).reshape(b * s, t, d)
            return self.attn(h).view(b, s, t, d).transpose(1, 2)
        return self.attn(h.reshape(b * t, s, d)).view(b, t, s, d)

    def _cross_attention(self, x: torch.Tensor, y: torch.Tensor,
                         y_bias: torch.Tensor) -> torch.Tensor:
        b, t, s, d = x.shape
        return self.cross_attn(x.reshape(b, t * s, d), y, y_bias).view(b, t, s, d)


class Prologue(nn.Module):
    """latent, t, caption -> tokens x, modulation t_mod, conditioning c, caption tokens y."""

    def __init__(self, cfg: STDiTConfig) -> None:
        super().__init__()
        d, p = cfg.hidden, cfg.patch
        self.cfg = cfg
        self.patch_embed = nn.Conv3d(cfg.in_channels, d, kernel_size=(1, p, p), stride=(1, p, p))
        grid = cfg.latent_size // p
        # Wavelengths matched to the (small) grids: with the usual max period of 10000 only a
        # handful of channels vary across 4 positions, and where the object is, is what text
        # must control (its direction of motion).
        self.register_buffer("pos_spatial", sincos_2d(grid, d, max_period=4.0 * grid),
                             persistent=False)
        self.register_buffer("pos_temporal",
                             sincos_1d(torch.arange(cfg.frames), d, 4.0 * cfg.frames),
                             persistent=False)
        self.t_embed = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        # pooled caption joins the timestep: a global "what to draw" signal for every block.
        # It is whitened with statistics of the training captions first (set_text_whitening):
        # in raw MiniLM space "left" and "right" captions have cosine 0.97 against 0.77 for
        # "red" and "blue", and gradient descent learns small input differences last.
        self.register_buffer("pooled_mean", torch.zeros(cfg.caption_dim))
        self.register_buffer("pooled_whiten", torch.eye(cfg.caption_dim))
        self.pooled_embed = nn.Sequential(nn.Linear(cfg.caption_dim, d), nn.SiLU(),
                                          nn.Linear(d, d))
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.caption_embed = nn.Sequential(nn.Linear(cfg.caption_dim, d),
                                           nn.GELU(approximate="tanh"), nn.Linear(d, d))

    def forward(self, latent: torch.Tensor, t: torch.Tensor, caption: torch.Tensor,
                caption_mask: torch.Tensor):
        """latent (B,C,T,H,W); t (B,) in [0,1]; caption (B,L,384); caption_mask (B,L) 1=token.

        Returns x (B,T,S,D), t_mod (B,6,D), c (B,D), y (B,L,D), y_bias (B,1,1,L)."""
        x = self.patch_embed(latent)                                  # (B, D, T, h, w)
        b, d, frames = x.shape[:3]
        x = x.flatten(3).permute(0, 2, 3, 1)                          # (B, T, S, D)
        x = x + self.pos_spatial[None, None] + self.pos_temporal[:frames, None][None]
        mask = caption_mask.to(caption.dtype)
        pooled = (caption * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        pooled = (pooled - self.pooled_mean) @ self.pooled_whiten
        c = self.t_embed(sincos_1d(t * 1000.0, 256)) + self.pooled_embed(pooled)
        t_mod = self.t_block(c).view(b, 6, d)
        y = self.caption_embed(caption)
        y_bias = ((1.0 - mask) * -1e4)[:, None, None, :]
        return x, t_mod, c, y, y_bias


    @torch.no_grad()
    def set_text_whitening(self, caption: torch.Tensor, caption_mask: torch.Tensor,
                           shrink: float = 0.1) -> None:
        """Whitening of pooled captions from a set of training captions: (x - mean) W with
        W = (cov + shrink * max_eig * I)^(-1/2). Shrinkage keeps directions in which training
        captions barely vary from blowing up for unseen phrasings."""
        mask = caption_mask.to(caption.dtype)[..., None]
        pooled = (caption * mask).sum(1) / mask.sum(1)
        mean = pooled.mean(0)
        x = (pooled - mean).double()
        evals, evecs = torch.linalg.eigh(x.T @ x / len(x))
        evals = evals.clamp(min=0) + shrink * evals.max()
        self.pooled_mean.copy_(mean)
        self.pooled_whiten.copy_((evecs @ torch.diag(evals.rsqrt()) @ evecs.T).float())


class STDiTPair(nn.Module):
    """A spatial block followed by a temporal block: the unit the exporters cut at."""

    def __init__(self, cfg: STDiTConfig) -> None:
        super().__init__()
        self.spatial = STBlock(cfg, temporal=False)
        self.temporal = STBlock(cfg, temporal=True)

    def forward(self, x, t_mod, y, y_bias, merged: bool = False):
        x = self.spatial(x, t_mod, y, y_bias, merged)
        return self.temporal(x, t_mod, y, y_bias, merged)


class MergedPair(nn.Module):
    """The TDTM variant of a pair: the very same modules (so the same parameters under the
    same names), run with temporal token merging. Exporters compile it as a second graph of
    the pair's block."""

    def __init__(self, pair: STDiTPair) -> None:
        super().__init__()
        self.spatial, self.temporal = pair.spatial, pair.temporal

    def forward(self, x, t_mod, y, y_bias):
        x = self.spatial(x, t_mod, y, y_bias, merged=True)
        return self.temporal(x, t_mod, y, y_bias, merged=True)


class Epilogue(nn.Module):
    """tokens x (B,T,S,D), conditioning c (B,D) -> velocity (B,C,T,H,W)."""

    def __init__(self, cfg: STDiTConfig) -> None:
        super().__init__()
        d, p = cfg.hidden, cfg.patch
        self.cfg = cfg
        self.norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.scale_shift_table = nn.Parameter(torch.randn(2, d) / d**0.5)
        self.linear = nn.Linear(d, p * p * cfg.in_channels)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        b, t, s, _ = x.shape
        shift, scale = (self.scale_shift_table[None] + c[:, None])[:, :, None, None].unbind(1)
        x = self.linear(modulate(self.norm(x), shift, scale))         # (B, T, S, p*p*C)
        p, ch, g = self.cfg.patch, self.cfg.in_channels, self.cfg.latent_size // self.cfg.patch
        x = x.view(b, t, g, g, p, p, ch).permute(0, 6, 1, 2, 4, 3, 5)  # B C T gh p gw p
        return x.reshape(b, ch, t, g * p, g * p)


class STDiT(nn.Module):
    def __init__(self, cfg: STDiTConfig = STDiTConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.prologue = Prologue(cfg)
        self.pairs = nn.ModuleList(STDiTPair(cfg) for _ in range(cfg.pairs))
        self.epilogue = Epilogue(cfg)
        # the "empty caption" for classifier-free guidance, learned like Open-Sora's y_embedding
        self.null_caption = nn.Parameter(torch.randn(cfg.caption_len, cfg.caption_dim) * 0.1)
        self._init_weights()

    def _init_weights(self) -> None:
        # The output starts at zero. The conditioning paths (adaLN-single and cross-attention)
        # start small but not zero: zero-initialised, they still had ~10x smaller weights than
        # self-attention after 400 steps, and the caption barely steered the layout.
        nn.init.normal_(self.prologue.t_block[1].weight, std=0.02)
        nn.init.zeros_(self.prologue.t_block[1].bias)
        nn.init.zeros_(self.epilogue.linear.weight)
        nn.init.zeros_(self.epilogue.linear.bias)

    def null_condition(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Caption tokens and mask of the null caption, repeated `batch` times."""
        tokens = self.null_caption[None].expand(batch, -1, -1)
        return tokens, torch.ones(batch, self.cfg.caption_len, dtype=torch.int64)

    def run_pairs(self, x: torch.Tensor, t_mod: torch.Tensor, y: torch.Tensor,
                  y_bias: torch.Tensor, merged: bool = False) -> torch.Tensor:
        for pair in self.pairs:
            x = pair(x, t_mod, y, y_bias, merged)
        return x

    def forward(self, latent: torch.Tensor, t: torch.Tensor, caption: torch.Tensor,
                caption_mask: torch.Tensor, merged: bool = False) -> torch.Tensor:
        """merged: every pair with temporal token merging (TDTM)."""
        x, t_mod, c, y, y_bias = self.prologue(latent, t, caption, caption_mask)
        return self.epilogue(self.run_pairs(x, t_mod, y, y_bias, merged), c)
