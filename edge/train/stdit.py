"""Train tiny-sora's transformer with rectified flow on VAE latents of the procedural clips.

Recipe, and why:
- Latents, not pixels: 16 frames x 4 x 4 patches = 256 tokens per clip keeps a step near one
  second on two CPU cores.
- Timesteps t = shift(u, 3) with u uniform: where the object is and which way it moves is
  decided at high noise, which logit-normal sampling rarely visits. The sampler uses the
  same shift at inference.
- The pooled caption, whitened with the training captions' statistics, joins the timestep
  embedding, so every block's modulation knows the caption, not only the cross-attention.
  Without whitening a run learned colour by step 800 but still ignored direction at 1200:
  "left"/"right" captions differ ~7x less than "red"/"blue" in MiniLM space.
- Captions are dropped to the learned null caption 10% of the time (classifier-free guidance).
- An EMA of the weights is what ships.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from edge.core.schedulers import shift_sigmas
from edge.models.stdit import STDiT, STDiTConfig
from edge.models.text_encoder import TextEncoder
from edge.models.tiny_sora_data import (
    COLOR_WORDS,
    DIRECTION_WORDS,
    SHAPE_WORDS,
    TRAIN_COMBINATIONS,
    TRAIN_TEMPLATES,
    Attributes,
    render_clip,
)
from edge.models.vae import encode_video


def all_training_captions(a: Attributes) -> list[str]:
    """Every caption the training templates and synonyms can write for `a`."""
    return [t.format(color=c, shape=s, direction=d) for t, c, s, d in itertools.product(
        TRAIN_TEMPLATES, COLOR_WORDS[a.color], SHAPE_WORDS[a.shape], DIRECTION_WORDS[a.direction])]


class LatentClips:
    """A fixed set of clips encoded once to latents, plus every caption of each combination
    encoded once by the text encoder; batches pair a clip with a random caption of its
    combination."""

    def __init__(self, vae, text_encoder: TextEncoder, clips: int, seed: int,
                 encode_batch: int = 64) -> None:
        rng = np.random.default_rng(seed)
        self.combo_index = rng.integers(len(TRAIN_COMBINATIONS), size=clips)
        latents = []
        for start in tqdm(range(0, clips, encode_batch), desc="encode clips", unit="batch"):
            idx = self.combo_index[start:start + encode_batch]
            video = np.stack([render_clip(TRAIN_COMBINATIONS[i], rng) for i in idx])
            latents.append(encode_video(vae, torch.from_numpy(video)))
        self.latents = torch.cat(latents)
        self.caption_tokens, self.caption_mask, self.captions_of_combo = [], [], []
        offset = 0
        for a in TRAIN_COMBINATIONS:
            caps = all_training_captions(a)
            tokens, mask = text_encoder(caps)
            self.caption_tokens.append(tokens)
            self.caption_mask.append(mask)
            self.captions_of_combo.append((offset, len(caps)))
            offset += len(caps)
        self.caption_tokens = torch.cat(self.caption_tokens)
        self.caption_mask = torch.cat(self.caption_mask)

    def batch(self, size: int, rng: np.random.Generator):
        idx = rng.integers(len(self.latents), size=size)
        cap = [self.captions_of_combo[c][0] + rng.integers(self.captions_of_combo[c][1])
               for c in self.combo_index[idx]]
        return self.latents[idx], self.caption_tokens[cap], self.caption_mask[cap]


def sample_t(size: int, shift: float, generator: torch.Generator) -> torch.Tensor:
    return shift_sigmas(torch.rand(size, generator=generator), shift)


def train_stdit(data: LatentClips, cfg: STDiTConfig, steps: int, batch: int, seed: int,
                lr: float = 5e-4, shift: float = 3.0, drop_caption: float = 0.1,
                ema_decay: float = 0.998, checkpoint_every: int = 0,
                on_checkpoint=None) -> tuple[STDiT, dict]:
    """Returns the EMA model. `on_checkpoint(step, ema)` is called every `checkpoint_every`
    steps so long runs can be inspected while they train."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    model = STDiT(cfg)
    model.prologue.set_text_whitening(data.caption_tokens, data.caption_mask)
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                pct_start=0.04, final_div_factor=10)
    losses = []
    bar = tqdm(range(steps), desc="transformer", unit="step")
    for step in bar:
        x0, caption, mask = data.batch(batch, rng)
        drop = torch.rand(batch, generator=gen) < drop_caption
        null_tokens, null_mask = model.null_condition(batch)
        caption = torch.where(drop[:, None, None], null_tokens, caption)
        mask = torch.where(drop[:, None], null_mask, mask)
        t = sample_t(batch, shift, gen)
        noise = torch.randn(x0.shape, generator=gen)
        tb = t.view(-1, 1, 1, 1, 1)
        xt = (1 - tb) * x0 + tb * noise
        loss = F.mse_loss(model(xt, t, caption, mask), noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        decay = min(ema_decay, (1 + step) / (10 + step))  # short warm-up of the average
        with torch.no_grad():
            for p_ema, p in zip(ema.parameters(), model.parameters(), strict=True):
                p_ema.lerp_(p, 1 - decay)
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", refresh=False)
        if on_checkpoint and checkpoint_every and (step + 1) % checkpoint_every == 0:
            on_checkpoint(step + 1, ema)
    ema.eval()
    return ema, {"transformer_final_loss": float(np.mean(losses[-200:])),
                 "transformer_params": sum(p.numel() for p in ema.parameters())}
