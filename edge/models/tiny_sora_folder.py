"""Reading a tiny-sora weights folder (`generate --weights DIR`, `export --model DIR`): its
tiny-sora.json checked field by field before a module is built, its safetensors read with
the file named when they are truncated or do not fit the config. Every refusal is a
`WeightsFolderError` whose message names the file and the field."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

from torch import nn

from edge.core.sampler import SamplerSettings
from edge.models.stdit import STDiTConfig

CONFIG = "tiny-sora.json"
# a bound on every size field: far above any tiny-sora, far below what would build modules
# for minutes or exhaust memory before the weights are read
MAX_SIZE = 1 << 16


class WeightsFolderError(ValueError):
    """A tiny-sora weights folder edge cannot take; the message names the file and field."""


def read_config(folder: Path) -> dict:
    """tiny-sora.json as an object with a checked `transformer` and `sampler`."""
    path = folder / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise WeightsFolderError(f"{path}: not a JSON file ({err})") from None
    except OSError as err:
        raise WeightsFolderError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not isinstance(config, dict):
        raise WeightsFolderError(f"{path}: must be a JSON object")
    for key in ("transformer", "sampler"):
        if not isinstance(config.get(key), dict):
            raise WeightsFolderError(f"{path}: field {key!r} must be an object")
    transformer_config(config, path)
    sampler_settings(config, path)
    return config


def _size_error(path: Path, name: str, value, kind: str) -> WeightsFolderError:
    return WeightsFolderError(f"{path}: transformer.{name} is {json.dumps(value)}; it must be "
                              f"{kind}")


def transformer_config(config: dict, path: Path) -> STDiTConfig:
    """The transformer's fields: known names, positive integers (≤ MAX_SIZE) where the
    config has integers, a positive finite mlp_ratio, heads dividing hidden and patch the
    latent size."""
    given = config["transformer"]
    known = {f.name: f.default for f in fields(STDiTConfig)}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise WeightsFolderError(f"{path}: transformer field(s) {', '.join(unknown)} are not "
                                 f"tiny-sora's; known: {', '.join(known)}")
    for name, value in given.items():
        if isinstance(known[name], float):
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or not 0 < value <= 64):
                raise _size_error(path, name, value, "a number in (0, 64]")
        elif (isinstance(value, bool) or not isinstance(value, int)
              or not 1 <= value <= MAX_SIZE):
            raise _size_error(path, name, value, f"an integer in [1, {MAX_SIZE}]")
    cfg = STDiTConfig(**given)
    if cfg.hidden % cfg.heads:
        raise WeightsFolderError(f"{path}: transformer.heads {cfg.heads} does not divide "
                                 f"transformer.hidden {cfg.hidden}")
    if cfg.latent_size % cfg.patch:
        raise WeightsFolderError(f"{path}: transformer.patch {cfg.patch} does not divide "
                                 f"transformer.latent_size {cfg.latent_size}")
    return cfg


def sampler_settings(config: dict, path: Path) -> SamplerSettings:
    """The sampler defaults, each a JSON number or string of its field's kind."""
    given = config["sampler"]
    for name, value in given.items():
        if not isinstance(value, bool | int | float | str | type(None)) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise WeightsFolderError(f"{path}: sampler.{name} is {json.dumps(value)}; it must "
                                     "be a finite number or a name")
    for name in ("steps", "num_train_timesteps"):
        value = given.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WeightsFolderError(f"{path}: sampler.{name} is {json.dumps(value)}; it must "
                                     "be a positive integer")
    try:
        return SamplerSettings.from_dict(given)
    except (TypeError, ValueError) as err:
        raise WeightsFolderError(f"{path}: sampler: {err}") from None


def load_weights(module: nn.Module, path: Path) -> None:
    """`path`'s tensors into `module`, refusing an unreadable or truncated file and tensors
    that do not fit the module (missing, unexpected, other shapes), naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(path)
    except (SafetensorError, OSError) as err:
        raise WeightsFolderError(f"{path}: not a readable safetensors file (truncated or "
                                 f"damaged?): {err}") from None
    try:
        module.load_state_dict(state)
    except RuntimeError as err:
        detail = " ".join(line.strip() for line in str(err).splitlines()[1:3])
        raise WeightsFolderError(f"{path}: its tensors do not fit {CONFIG}'s transformer: "
                                 f"{detail}") from None


def load_vae(folder: Path):
    """The folder's VAE (diffusers' AutoencoderKL), its errors naming the folder."""
    from diffusers import AutoencoderKL
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # no advice to install `accelerate`
    try:
        return AutoencoderKL.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, TypeError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise WeightsFolderError(f"{folder}: not a readable VAE folder: {first}") from None

