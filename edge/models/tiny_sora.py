"""tiny-sora: the default text-to-video model, as a PyTorch reference pipeline.

text encoder (MiniLM) -> STDiT denoised by the rectified-flow sampler -> VAE decoder per frame.
Weights ship in `edge/weights/tiny-sora/` (written by `edge train tiny-sora`). This pipeline
only composes named components; the sampler is the NumPy one every runtime shares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKL

from edge.core.options import check_prompts, check_seeds, with_overrides
from edge.core.sampler import SamplerSettings, Step, Trace, initial_noise, run_pairs, sample
from edge.models.stdit import STDiT, STDiTConfig
from edge.models.text_encoder import TextEncoder
from edge.models.tiny_sora_folder import WeightsFolderError, load_vae, load_weights, read_config
from edge.models.vae import decode_latents

DEFAULT_WEIGHTS = Path(__file__).resolve().parent.parent / "weights" / "tiny-sora"
REQUIRED_FILES = ("tiny-sora.json", "transformer.safetensors", "vae/config.json",
                  "vae/diffusion_pytorch_model.safetensors")


def check_weights_dir(path: Path) -> None:
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise WeightsFolderError(
            f"tiny-sora weights folder {path} lacks {', '.join(missing)}; "
            "run `edge train tiny-sora` to create it")


def load_sampler(path: str | Path = DEFAULT_WEIGHTS) -> SamplerSettings:
    """The sampler defaults a tiny-sora weights folder names (its tiny-sora.json)."""
    path = Path(path)
    check_weights_dir(path)
    return SamplerSettings.from_dict(read_config(path)["sampler"])


@dataclass
class TinySora:
    text_encoder: TextEncoder
    transformer: STDiT
    vae: AutoencoderKL
    sampler: SamplerSettings
    last_trace: Trace = field(default_factory=Trace)  # what the last sampling did

    @classmethod
    def load(cls, path: str | Path = DEFAULT_WEIGHTS) -> TinySora:
        path = Path(path)
        check_weights_dir(path)
        config = read_config(path)  # every field checked before a module is built
        transformer = STDiT(STDiTConfig(**config["transformer"]))
        load_weights(transformer, path / "transformer.safetensors")
        vae = load_vae(path / "vae")
        return cls(TextEncoder(), transformer.eval(), vae.eval(),
                   SamplerSettings.from_dict(config["sampler"]))

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        c = self.transformer.cfg
        return (c.in_channels, c.frames, c.latent_size, c.latent_size)

    @property
    def frame_size(self) -> tuple[int, int]:
        """(height, width) of the frames it decodes: the VAE upsamples once per level."""
        side = self.transformer.cfg.latent_size * 2 ** (len(self.vae.config.block_out_channels)
                                                        - 1)
        return side, side

    @torch.no_grad()
    def generate_latents(self, prompts: list[str], seeds: list[int],
                         on_step: Callable[[int, int], None] | None = None,
                         **sampler_overrides) -> np.ndarray:
        settings = with_overrides(self.sampler, sampler_overrides)
        caption, mask = self.text_encoder(prompts)
        null_caption, null_mask = self.transformer.null_condition(len(prompts))
        caption2, mask2 = torch.cat([caption, null_caption]), torch.cat([mask, null_mask])

        model = self.transformer

        def predict(x: np.ndarray, t: float, step: Step) -> tuple[np.ndarray, np.ndarray | None]:
            # a guided call runs the caption and null halves together, else the caption alone
            rows = 2 * len(x) if step.guided else len(x)
            x2 = torch.from_numpy(np.concatenate([x, x])[:rows])
            tokens, t_mod, c, y, y_bias = model.prologue(x2, torch.full((rows,), t),
                                                         caption2[:rows], mask2[:rows])

            def pairs(h: np.ndarray) -> np.ndarray:
                return model.run_pairs(torch.from_numpy(h), t_mod, y, y_bias,
                                       step.merged).numpy()

            tokens, _ = run_pairs(step, tokens.numpy(), t_mod.numpy(), pairs)
            v = model.epilogue(torch.from_numpy(tokens), c).numpy()
            return v[: len(x)], (v[len(x):] if step.guided else None)

        self.last_trace = Trace()
        return sample(predict, initial_noise(self.latent_shape, seeds), settings, on_step,
                      self.last_trace)

    @torch.no_grad()
    def decode(self, latents: np.ndarray) -> np.ndarray:
        """latents (B, C, T, h, w) -> uint8 video (B, T, H, W, 3)."""
        video = decode_latents(self.vae, torch.from_numpy(latents)).numpy()
        return np.round(video * 255).astype(np.uint8)

    def generate(self, prompts: str | list[str], seed: int | list[int] = 0,
                 on_step: Callable[[int, int], None] | None = None,
                 **sampler_overrides) -> np.ndarray:
        """One video per prompt: uint8 (B, T, H, W, 3). A single seed s gives prompt i the
        seed s + i, so a batch is as reproducible as its prompts one by one."""
        prompts = check_prompts(prompts)
        seeds = check_seeds(seed, len(prompts))
        return self.decode(self.generate_latents(prompts, seeds, on_step, **sampler_overrides))
