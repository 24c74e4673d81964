"""tiny-sora's VAE: a diffusers `AutoencoderKL` with a tiny config, applied frame by frame.

32x32 RGB frames <-> 4x8x8 latents (4x spatial downsampling, 4 latent channels). Latents are
multiplied by `scaling_factor` (measured after training so they have unit variance) before
the transformer sees them, as in Stable Diffusion and Open-Sora.
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL

VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 3,
    up_block_types=("UpDecoderBlock2D",) * 3,
    block_out_channels=(32, 64, 64),   # three levels -> two downsamplings -> 4x
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=16,
    sample_size=32,
    scaling_factor=1.0,                # replaced by the measured value after training
)


def build_vae(**overrides) -> AutoencoderKL:
    return AutoencoderKL(**(VAE_CONFIG | overrides))


def frames_to_batch(video: torch.Tensor) -> torch.Tensor:
    """(B, T, H, W, 3) in [0, 1] -> (B*T, 3, H, W) in [-1, 1]."""
    b, t, h, w, c = video.shape
    return video.reshape(b * t, h, w, c).permute(0, 3, 1, 2) * 2 - 1


@torch.no_grad()
def encode_video(vae: AutoencoderKL, video: torch.Tensor) -> torch.Tensor:
    """(B, T, H, W, 3) in [0, 1] -> scaled latents (B, C, T, h, w) (posterior mean)."""
    b, t = video.shape[:2]
    z = vae.encode(frames_to_batch(video)).latent_dist.mean * vae.config.scaling_factor
    return z.view(b, t, *z.shape[1:]).transpose(1, 2).contiguous()


@torch.no_grad()
def decode_latents(vae: AutoencoderKL, latents: torch.Tensor) -> torch.Tensor:
    """scaled latents (B, C, T, h, w) -> (B, T, H, W, 3) in [0, 1]."""
    b, c, t, h, w = latents.shape
    z = latents.transpose(1, 2).reshape(b * t, c, h, w) / vae.config.scaling_factor
    x = vae.decode(z).sample.clamp(-1, 1)
    x = (x + 1) / 2
    return x.view(b, t, *x.shape[1:]).permute(0, 1, 3, 4, 2).contiguous()
