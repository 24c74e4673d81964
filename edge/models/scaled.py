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

from edge.core.budget import format_size, physical_memory_bytes
from edge.core.package import atomic_directory, check_replaceable, not_edges
from edge.models.stdit import STDiT, STDiTConfig
from edge.models.tiny_sora import DEFAULT_WEIGHTS, check_weights_dir

# what `edge scale-model` writes: the top-level names of each kind of folder, and the mark
# its config carries (tiny-sora.json's "random_weights", model_index.json's
# "_edge_random_weights": diffusers ignores keys that start with "_")
SCALED_TINY_SORA = {"tiny-sora.json", "transformer.safetensors", "vae"}
SCALED_DIFFUSERS = {"model_index.json", "tokenizer", "scheduler", "vae", "transformer",
                    "text_encoder"}
# an Open-Sora folder has no index of its own: the mark is a file beside its parts
SCALED_OPENSORA = {"edge_random_weights.json", "tokenizer", "vae", "transformer",
                   "text_encoder"}


def identify_scaled_model(dest: Path) -> str:
    """What `edge scale-model` wrote at `dest`; any other folder is refused with the reason
    (PackageWriteError): scale-model replaces only its own random-weight folders."""
    for config, names, mark in (("tiny-sora.json", SCALED_TINY_SORA, "random_weights"),
                                ("model_index.json", SCALED_DIFFUSERS, "_edge_random_weights"),
                                ("edge_random_weights.json", SCALED_OPENSORA,
                                 "random_weights")):
        path = dest / config
        if not path.is_file():
            continue
        try:
            written = json.loads(path.read_text()).get(mark)
        except (ValueError, AttributeError):
            written = None
        if not isinstance(written, dict):
            raise not_edges(dest, f"a model folder that `edge scale-model` did not write (its "
                                  f"{config} has no {mark!r})")
        other = sorted(p.name for p in dest.iterdir() if p.name not in names)
        if other:
            raise not_edges(dest, f"a random-weight model folder, but it also holds "
                                  f"{', '.join(other[:3])}")
        return f"the random-weight model folder (seed {written.get('seed')})"
    raise not_edges(dest, "not a model folder that `edge scale-model` wrote (no tiny-sora.json, "
                          "model_index.json or edge_random_weights.json)")


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
