"""`edge train tiny-sora`: reproduce the shipped weights from scratch on a CPU.

Stages (fixed seed, progress bar each): VAE -> encode a clip set to latents -> transformer
-> attribute classifier. Writes into `out_dir` the files `edge.models.tiny_sora` loads and a
`training.json` with the settings, figures and wall time of every stage.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from diffusers import AutoencoderKL
from safetensors.torch import save_file

from edge.core.sampler import SamplerSettings
from edge.models.stdit import STDiTConfig
from edge.models.text_encoder import TextEncoder
from edge.train.classifier import train_classifier
from edge.train.stdit import LatentClips, train_stdit
from edge.train.vae import train_vae


@dataclass(frozen=True)
class TrainingRecipe:
    seed: int = 0
    vae_steps: int = 800
    vae_batch_clips: int = 16
    clips: int = 10000
    transformer_steps: int = 2400
    transformer_batch: int = 32
    transformer_lr: float = 1e-3
    classifier_steps: int = 600
    classifier_batch: int = 32


# A recipe small enough for tests: proves the whole path runs, not that it learns.
SMOKE_RECIPE = TrainingRecipe(vae_steps=2, vae_batch_clips=2, clips=8, transformer_steps=2,
                              transformer_batch=2, classifier_steps=2, classifier_batch=2)


# tiny-sora's sampler defaults: 30 steps of flow-match Euler at shift 3 and, where --leap
# is asked for, the leap that keeps the video (after 6 steps, the rest in 10 re-planned steps:
# docs/benchmarks.md, "Step leaping, token merging and the step cache")
TINY_SORA_SAMPLER = SamplerSettings(steps=30, guidance=5.0, shift=3.0, leap_after=6,
                                    leap_steps=10)


def save_weights(out_dir: Path, vae, transformer, classifier, config: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    vae.save_pretrained(out_dir / "vae", safe_serialization=True)
    save_file({k: v.contiguous() for k, v in transformer.state_dict().items()},
              out_dir / "transformer.safetensors")
    save_file(classifier.state_dict(), out_dir / "classifier.safetensors")
    (out_dir / "tiny-sora.json").write_text(json.dumps(config, indent=2) + "\n")


def train_tiny_sora(out_dir: Path, recipe: TrainingRecipe = TrainingRecipe(),
                    cfg: STDiTConfig = STDiTConfig(), threads: int | None = None,
                    checkpoint_every: int = 0, vae_from: Path | None = None) -> dict:
    """Train every component and write the weights folder. With `checkpoint_every`, the
    transformer's EMA is also saved to out_dir/checkpoints/ during training."""
    if threads:
        torch.set_num_threads(threads)
    log: dict = {"recipe": asdict(recipe), "torch_threads": torch.get_num_threads()}
    started = time.perf_counter()

    t0 = time.perf_counter()
    if vae_from:  # iterate on the transformer without retraining the (deterministic) VAE
        vae = AutoencoderKL.from_pretrained(vae_from).eval().requires_grad_(False)
        log["vae_reused_from"] = str(vae_from)
    else:
        vae, figures = train_vae(recipe.vae_steps, recipe.vae_batch_clips, recipe.seed)
        log |= figures | {"vae_seconds": time.perf_counter() - t0}

    t0 = time.perf_counter()
    data = LatentClips(vae, TextEncoder(), recipe.clips, recipe.seed)
    log["encode_seconds"] = time.perf_counter() - t0

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vae.save_pretrained(out_dir / "vae", safe_serialization=True)

    def checkpoint(step: int, ema) -> None:
        (out_dir / "checkpoints").mkdir(exist_ok=True)
        save_file(ema.state_dict(), out_dir / "checkpoints" / f"transformer-{step}.safetensors")

    t0 = time.perf_counter()
    transformer, figures = train_stdit(data, cfg, recipe.transformer_steps,
                                       recipe.transformer_batch, recipe.seed,
                                       lr=recipe.transformer_lr,
                                       checkpoint_every=checkpoint_every,
                                       on_checkpoint=checkpoint)
    log |= figures | {"transformer_seconds": time.perf_counter() - t0}
    del data

    t0 = time.perf_counter()
    classifier, figures = train_classifier(recipe.classifier_steps, recipe.classifier_batch,
                                           recipe.seed)
    log |= figures | {"classifier_seconds": time.perf_counter() - t0}
    log["total_seconds"] = time.perf_counter() - started

    config = {"transformer": cfg.to_dict(), "sampler": TINY_SORA_SAMPLER.to_dict(),
              "training": log}
    save_weights(out_dir, vae, transformer, classifier, config)
    return log
