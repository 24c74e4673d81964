"""Open-Sora 1.2's text-to-video sampling in PyTorch, as its own inference script samples
(RFLOW, `scripts/inference.py` with the v1.2 inference config), on edge's STDiT3 and VAE:
the reference every export of the opensora family is checked against, itself checked against
the original implementation's outputs (tests/test_opensora.py).

- The prompt through the T5 v1.1 encoder with its attention mask, padded to the model's
  `model_max_length`; the unconditional half is the learned null caption (`y_embedding`)
  under the prompt's mask.
- Model times t_i = (1 - i/N) 1000, each moved by r = sqrt(h w / 512²) sqrt(frames // 17 x 5)
  as t' = r t / (1 + (r - 1) t) (t in [0, 1]); x <- x + v (t_i - t_{i+1}) / 1000 with the last
  step to 0, v = uncond + g (cond - uncond) on the first latent channels. Computed in float32
  tensors, as the original computes them.
- The frame rate, height and width as the model's inputs (24 fps by default).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from edge.families.opensora.stdit3 import STDiT3
from edge.families.opensora.vae import OpenSoraVAE

NUM_TIMESTEPS = 1000
BASE_RESOLUTION = 512 * 512
FPS = 24                       # the v1.2 inference config's
STEPS = 30
GUIDANCE = 7.0
AESTHETIC_SUFFIX = " aesthetic score: 6.5."   # what Open-Sora's script appends (an option)


def time_shift(height: int, width: int, frames: int) -> float:
    """RFLOW's timestep transform ratio for a video size (pixels, video frames): the space
    ratio sqrt(h w / 512²) times sqrt of 5 per whole 17-frame chunk (1 for an image), in
    float32 as the original computes it."""
    space = torch.sqrt(torch.tensor(float(height)) * torch.tensor(float(width))
                       / BASE_RESOLUTION)
    chunks = 1.0 if frames == 1 else float(frames // 17 * 5)
    return float(space * math.sqrt(chunks))


def rflow_timesteps(steps: int, shift: float) -> torch.Tensor:
    """The model times (0..1000, float32) of `steps` steps: (1 - i/N) 1000 shifted."""
    t = torch.tensor([(1.0 - i / steps) * NUM_TIMESTEPS for i in range(steps)]) / NUM_TIMESTEPS
    r = torch.tensor(shift, dtype=torch.float32)
    return r * t / (1 + (r - 1) * t) * NUM_TIMESTEPS


@dataclass
class OpenSoraPipeline:
    """The components of an Open-Sora 1.2 folder, float32, and its sampling."""

    transformer: STDiT3
    vae: OpenSoraVAE
    text_encoder: nn.Module        # transformers' T5EncoderModel
    tokenizer: object              # transformers' fast T5 tokenizer

    @property
    def device(self) -> torch.device:
        """Where its transformer's weights are (the reference may run on a GPU)."""
        return self.transformer.y_embedder.y_embedding.device

    @property
    def text_tokens(self) -> int:
        return self.transformer.cfg.model_max_length

    def tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.tokenizer(prompts, max_length=self.text_tokens, padding="max_length",
                             truncation=True, add_special_tokens=True, return_tensors="pt")
        return out.input_ids, out.attention_mask

    @torch.no_grad()
    def encode_prompt(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions (B, L, caption channels) and their masks (B, L)."""
        ids, mask = self.tokenize(prompts)
        ids, mask = ids.to(self.device), mask.to(self.device)
        return self.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state, mask

    def null_caption(self, batch: int) -> torch.Tensor:
        return self.transformer.y_embedder.y_embedding[None].expand(batch, -1, -1)

    @torch.no_grad()
    def sample(self, z: torch.Tensor, caption: torch.Tensor, mask: torch.Tensor,
               steps: int, guidance: float, height: int, width: int, frames: int,
               fps: float = FPS,
               on_step: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """RFLOW from initial latents z (B, C, T, h, w) with the captions' guidance."""
        b = z.shape[0]
        times = rflow_timesteps(steps, time_shift(height, width, frames)).to(z.device)
        y = torch.cat([caption, self.null_caption(b)])
        masks = torch.cat([mask, mask])  # the null caption under the prompt's mask
        rates = torch.full((2 * b,), float(fps), device=z.device)
        channels = self.transformer.cfg.in_channels
        for i, t in enumerate(times):
            out = self.transformer(torch.cat([z, z]), t.repeat(2 * b), y, masks, rates,
                                   height, width)
            cond, uncond = out[:, :channels].chunk(2)
            v = uncond + guidance * (cond - uncond)
            dt = (t - times[i + 1] if i + 1 < steps else t) / NUM_TIMESTEPS
            z = z + v * dt
            if on_step is not None:
                on_step(i + 1, steps)
        return z

    @torch.no_grad()
    def __call__(self, prompt: str | list[str], height: int, width: int, frames: int,
                 steps: int = STEPS, guidance: float = GUIDANCE, fps: float = FPS,
                 latents: torch.Tensor | None = None,
                 generator: torch.Generator | None = None, output_type: str = "pt",
                 on_step: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Latents (output_type "latent") or the video (B, 3, frames, height, width) in
        [-1, 1] ("pt") for the prompts, from `latents` or those `generator` draws
        (torch.randn of the latent shape, as the original draws them)."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        caption, mask = self.encode_prompt(prompts)
        if latents is None:
            shape = (len(prompts), self.transformer.cfg.in_channels,
                     self.vae.latent_frames(frames), height // 8, width // 8)
            latents = torch.randn(shape, generator=generator)  # on the CPU, as the original
        z = self.sample(latents.to(self.device), caption, mask, steps, guidance, height, width,
                        frames, fps, on_step)
        if output_type == "latent":
            return z
        return self.vae.decode(z)
