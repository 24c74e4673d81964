"""tiny-sora's architecture at a larger size, where streaming matters.

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

from edge.core.budget import format_size, physical_memory_bytes
from edge.core.package import atomic_directory, check_replaceable
from edge.families.scaled import identify_scaled_model
from edge.models.stdit import STDiT, STDiTConfig
from edge.models.tiny_sora import DEFAULT_WEIGHTS, check_weights_dir


def parameter_count(cfg: STDiTConfig) -> int:
    """The model's parameters, counted on the meta device (nothing allocated) at one and
    two pairs and extended linearly: building a hundred million pairs, even without storage,
    would not end."""
    with torch.device("meta"):
        one, two = (sum(p.numel() for p in STDiT(replace(cfg, pairs=n)).parameters())
                    for n in (1, 2))
    return one + (cfg.pairs - 1) * (two - one)


def _check_fits_memory(cfg: STDiTConfig) -> None:
    """Refuse, before building anything, a model whose float32 weights (held twice while
    written: the model and the file's buffer) exceed this machine's memory; its parameters
    are counted on the meta device, which allocates nothing."""
    params = parameter_count(cfg)
    need = 2 * 4 * params
    memory = physical_memory_bytes()
    if need > memory:
        raise ValueError(f"--hidden {cfg.hidden} --pairs {cfg.pairs}: {params:,} parameters "
                         f"need about {format_size(need)} to write, more than this machine's "
                         f"{format_size(memory)} of memory")


def write_scaled_model(out: str | Path, hidden: int, pairs: int, heads: int,
                       seed: int = 0, force: bool = False) -> dict:
    """Write the model folder atomically; returns its config. An earlier folder at `out` is
    replaced only with `force`, and only when this command wrote it."""
    check_replaceable(Path(out), force, identify_scaled_model)
    base = json.loads((DEFAULT_WEIGHTS / "tiny-sora.json").read_text())
    cfg = replace(STDiTConfig(**base["transformer"]), hidden=hidden, pairs=pairs, heads=heads)
    if hidden % heads or (hidden // heads) % 2:
        raise ValueError(f"--hidden {hidden} must split into {heads} heads of even size")
    _check_fits_memory(cfg)
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
    with atomic_directory(out, identify_scaled_model) as tmp:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  tmp / "transformer.safetensors")
        shutil.copytree(DEFAULT_WEIGHTS / "vae", tmp / "vae")
        (tmp / "tiny-sora.json").write_text(json.dumps(config, indent=2) + "\n")
        check_weights_dir(tmp)
    return config
