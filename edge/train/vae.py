"""Train tiny-sora's VAE on single frames of the procedural clips."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL
from tqdm import tqdm

from edge.models.tiny_sora_data import all_combinations, sample_batch
from edge.models.vae import build_vae, decode_latents, encode_video, frames_to_batch


def train_vae(steps: int, batch_clips: int, seed: int, lr: float = 2e-3,
              kl_weight: float = 1e-6) -> tuple[AutoencoderKL, dict]:
    """Each step draws `batch_clips` fresh clips and trains on 4 random frames of each.

    All attribute combinations are used: the VAE only learns to draw, it never sees captions.
    Returns the VAE (with its measured latent scaling factor) and figures for the log."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    vae = build_vae()
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    combos = all_combinations()
    bar = tqdm(range(steps), desc="vae", unit="step")
    for _ in bar:
        video, _, _ = sample_batch(batch_clips, rng, combos)
        pick = rng.integers(video.shape[1], size=(batch_clips, 4))
        frames = torch.from_numpy(video[np.arange(batch_clips)[:, None], pick])
        x = frames_to_batch(frames)
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample()).sample
        loss = F.l1_loss(recon, x) + F.mse_loss(recon, x) + kl_weight * posterior.kl().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    vae.eval().requires_grad_(False)
    return vae, measure_vae(vae, rng)


@torch.no_grad()
def measure_vae(vae: AutoencoderKL, rng: np.random.Generator, clips: int = 64) -> dict:
    """Set the latent scaling factor to 1/std of the latents; report reconstruction PSNR."""
    video = torch.from_numpy(sample_batch(clips, rng, all_combinations())[0])
    vae.register_to_config(scaling_factor=1.0)
    latents = encode_video(vae, video)
    scale = float(1.0 / latents.std())
    vae.register_to_config(scaling_factor=scale)
    recon = decode_latents(vae, latents * scale)
    mse = float(((recon - video) ** 2).mean())
    return {"vae_scaling_factor": scale, "vae_psnr_db": 10 * np.log10(1.0 / mse)}
