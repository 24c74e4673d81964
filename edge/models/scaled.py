"""A scaled tiny-sora: the same architecture at a size where streaming matters.

`edge scale-model OUT --hidden 1024 --pairs 8` writes a model folder that every command takes
through `--model`/`--weights`: a larger STDiT with seeded random weights, and the shipped VAE.
Random weights make no sensible video, but they cost exactly what trained ones cost to read
and to compute, which is what speed and memory figures need.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from edge.models.stdit import STDiT, STDiTConfig
from edge.models.tiny_sora import DEFAULT_WEIGHTS, check_weights_dir
from edge.package import atomic_directory


def write_scaled_model(out: str | Path, hidden: int, pairs: int, heads: int,
                       seed: int = 0) -> dict:
    """Write the model folder atomically; returns its config."""
    base = json.loads((DEFAULT_WEIGHTS / "tiny-sora.json").read_text())
    cfg = replace(STDiTConfig(**base["transformer"]), hidden=hidden, pairs=pairs, heads=heads)
    if hidden % heads or (hidden // heads) % 2:
        raise ValueError(f"--hidden {hidden} must split into {heads} heads of even size")
    torch.manual_seed(seed)
    model = STDiT(cfg)
    with torch.no_grad():  # the adaLN-zero init leaves outputs at zero; exercise every path
        for p in model.parameters():
            if not p.any():
                p.normal_(0, 0.02)
    config = {"transformer": cfg.to_dict(), "sampler": base["sampler"],
              "random_weights": {"seed": seed,
                                 "transformer_params": sum(p.numel() for p in
                                                           model.parameters())}}
    with atomic_directory(out) as tmp:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  tmp / "transformer.safetensors")
        shutil.copytree(DEFAULT_WEIGHTS / "vae", tmp / "vae")
        (tmp / "tiny-sora.json").write_text(json.dumps(config, indent=2) + "\n")
        check_weights_dir(tmp)
    return config
