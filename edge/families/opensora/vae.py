"""Open-Sora 1.2's video VAE decoder (`hpcai-tech/OpenSora-VAE-v1.2`), written from its
architecture and loading the released checkpoint's key names: a causal temporal VAE that
turns each chunk of latent frames back into 2D-VAE latents at four times the frames, then an
SD-style 2D VAE (diffusers' AutoencoderKL, its weights the checkpoint's `spatial_vae.module.*`)
per frame.

decode(z): z * scale + shift per channel; chunks of `micro_z` latent frames (5: one chunk of
17 video frames), each decoded alone (its causal padding starts again, no state carried):
post_quant_conv, the decoder (4x the frames through depth-to-space in time), the first
frames dropped down to 17; then each frame / 0.18215 through the 2D decoder. Only the
decoding half is built: the encoder's weights in the checkpoint are not needed to sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edge.models.video_norm import VideoGroupNorm

SPATIAL_SCALE = 0.18215   # Open-Sora divides by this before the 2D decode, whatever the config


@dataclass(frozen=True)
class TemporalVAEConfig:
    """The released config's `vae_temporal` fields that shape the decoder."""

    filters: int = 128
    channel_multipliers: tuple[int, ...] = (1, 2, 2, 4)
    temporal_downsample: tuple[bool, ...] = (False, True, True)
    num_res_blocks: int = 4
    num_groups: int = 32
    in_out_channels: int = 4
    latent_embed_dim: int = 4
    embed_dim: int = 4

    @property
    def time_factor(self) -> int:
        return 2 ** sum(bool(d) for d in self.temporal_downsample)


class CausalConv3d(nn.Module):
    """A Conv3d padded with zeros before the first frame only (kernel - 1 frames) and
    symmetrically in space, so a frame never sees a later one."""

    def __init__(self, cin: int, cout: int, kernel: int, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, kernel, bias=bias)
        side = kernel // 2
        self.padding = (side, side, side, side, kernel - 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, self.padding))


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = VideoGroupNorm(groups, cin), CausalConv3d(cin, cout, 3, False)
        self.norm2, self.conv2 = VideoGroupNorm(groups, cout), CausalConv3d(cout, cout, 3, False)
        self.conv3 = CausalConv3d(cin, cout, 1, False) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (x if self.conv3 is None else self.conv3(x))


def depth_to_time(x: torch.Tensor) -> torch.Tensor:
    """(B, 2C, T, H, W) -> (B, C, 2T, H, W): channel 2c + s becomes channel c at frame 2t + s."""
    b, c2, t, h, w = x.shape
    x = x.reshape(b, c2 // 2, 2, t, h * w).transpose(2, 3)
    return x.reshape(b, c2 // 2, 2 * t, h, w)


class TemporalDecoder(nn.Module):
    def __init__(self, cfg: TemporalVAEConfig) -> None:
        super().__init__()
        f, mults, g = cfg.filters, cfg.channel_multipliers, cfg.num_groups
        blocks = cfg.num_res_blocks
        top = f * mults[-1]
        self.conv1 = CausalConv3d(cfg.latent_embed_dim, top, 3)
        self.res_blocks = nn.ModuleList(ResBlock(top, top, g) for _ in range(blocks))
        self.block_res_blocks = nn.ModuleList([nn.ModuleList() for _ in mults])
        self.conv_blocks = nn.ModuleList([nn.Identity() for _ in mults[1:]])
        prev = top
        for i in reversed(range(len(mults))):
            width = f * mults[i]
            self.block_res_blocks[i] = nn.ModuleList(
                ResBlock(prev if j == 0 else width, width, g) for j in range(blocks))
            prev = width
            if i > 0 and cfg.temporal_downsample[i - 1]:
                self.conv_blocks[i - 1] = CausalConv3d(prev, 2 * prev, 3)
        self.norm1 = VideoGroupNorm(g, f * mults[0])
        self.conv_out = CausalConv3d(f * mults[0], cfg.in_out_channels, 3)
        self.time_up = tuple(i > 0 and bool(cfg.temporal_downsample[i - 1])
                             for i in range(len(mults)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for block in self.res_blocks:
            x = block(x)
        for i in reversed(range(len(self.block_res_blocks))):
            for block in self.block_res_blocks[i]:
                x = block(x)
            if self.time_up[i]:
                x = depth_to_time(self.conv_blocks[i - 1](x))
        return self.conv_out(F.silu(self.norm1(x)))


class TemporalVAE(nn.Module):
    """The checkpoint's `temporal_vae` (its decoding half)."""

    def __init__(self, cfg: TemporalVAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.post_quant_conv = CausalConv3d(cfg.embed_dim, cfg.latent_embed_dim, 1)
        self.decoder = TemporalDecoder(cfg)

    def decode(self, z: torch.Tensor, frames: int) -> torch.Tensor:
        """One chunk of latent frames -> its `frames` frames of 2D-VAE latents, the first
        frames past them dropped (the decoder gives time_factor x the latent frames)."""
        x = self.decoder(self.post_quant_conv(z))
        return x[:, :, x.shape[2] - frames:]


class OpenSoraVAE(nn.Module):
    """The released VideoAutoencoderPipeline's decoder: `scale`, `shift`, `temporal_vae`,
    `spatial_vae.module` (diffusers' AutoencoderKL)."""

    def __init__(self, temporal: TemporalVAEConfig, spatial: nn.Module,
                 micro_frame_size: int) -> None:
        super().__init__()
        self.temporal_vae = TemporalVAE(temporal)
        # decoding only: the 2D encoder's weights are neither loaded nor held
        spatial.encoder, spatial.quant_conv = None, None
        self.spatial_vae = nn.Module()
        self.spatial_vae.module = spatial
        channels = temporal.embed_dim
        self.register_buffer("scale", torch.ones(1, channels, 1, 1, 1))
        self.register_buffer("shift", torch.zeros(1, channels, 1, 1, 1))
        self.micro_frame_size = micro_frame_size

    @property
    def micro_z(self) -> int:
        """Latent frames of one chunk of `micro_frame_size` video frames."""
        return -(-self.micro_frame_size // self.temporal_vae.cfg.time_factor)

    def latent_frames(self, frames: int) -> int:
        """Latent frames of a video of `frames` frames (whole chunks only)."""
        return frames // self.micro_frame_size * self.micro_z

    def decode_frames(self, x: torch.Tensor) -> torch.Tensor:
        """2D-VAE latents (B, C, F, h, w) -> video (B, 3, F, 8h, 8w), about [-1, 1]."""
        b, c, f, h, w = x.shape
        flat = x.transpose(1, 2).reshape(b * f, c, h, w) / SPATIAL_SCALE
        video = self.spatial_vae.module.decode(flat).sample
        return video.reshape(b, f, *video.shape[1:]).transpose(1, 2)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Sampled latents (B, C, T, h, w) -> video (B, 3, frames, 8h, 8w), about [-1, 1]."""
        z = z * self.scale + self.shift
        chunks = [self.temporal_vae.decode(z[:, :, i:i + self.micro_z], self.micro_frame_size)
                  for i in range(0, z.shape[2], self.micro_z)]
        return self.decode_frames(torch.cat(chunks, dim=2))
