"""Checks of a generation request (prompts, seeds, sampler settings) for the runtimes: a bad
value is refused with the option and the value named before any block runs, instead of
failing deep inside a block or producing noise (a NaN guidance scale gives a NaN video)."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from typing import Any

import numpy as np

from edge.core.noise import check_seed
from edge.core.sampler import SamplerSettings, timesteps

# Far above what any sampler uses; a schedule is `steps` long, so this bounds what a bad value
# (a damaged manifest, a typo) costs before anything runs.
MAX_STEPS = 10_000
MAX_TRAIN_TIMESTEPS = 1_000_000
# far above any useful guidance scale (models use 1 to 10); huge ones overflow into NaN
MAX_GUIDANCE = 1e4
# the settings whose default None stands for "off" and whose value is otherwise a real number
REAL_OR_NONE = ("shift_terminal",)


def check_prompts(prompts: Any, what: str = "prompt") -> list[str]:
    """One prompt or a non-empty list of them, each a string of valid Unicode text. Empty
    prompts are allowed (they mean "no caption"). `what` names them in errors (e.g.
    "negative prompt")."""
    items = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(items, list | tuple) or not items:
        raise ValueError(f"{what}s must be a string or a non-empty list of strings, got "
                         f"{prompts!r:.80}")
    for i, p in enumerate(items):
        named = what if isinstance(prompts, str) else f"{what} {i}"
        if not isinstance(p, str):
            raise ValueError(f"{named} must be a string, got {type(p).__name__}")
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as err:  # lone surrogates, e.g. from a bad decode
            raise ValueError(f"{named} is not valid Unicode text ({err.reason} at "
                             f"character {err.start})") from None
    return list(items)


def check_seeds(seed: Any, n: int) -> list[int]:
    """Seed i of n prompts: `seed + i` for one integer, else a list of n integers; each a
    seed as edge.core.noise defines it (0 to 2^63 - 1, PyTorch's manual_seed range)."""
    seeds = [seed + i for i in range(n)] if _is_int(seed) else seed
    if not isinstance(seeds, list | tuple) or len(seeds) != n:
        raise ValueError(f"seed must be an integer or a list of {n} integers, got {seed!r:.80}")
    return [check_seed(s) for s in seeds]


def _is_int(x: Any) -> bool:
    """A whole number, NumPy's included (np.int64 seeds come from arrays), but not a bool."""
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def _check_value(name: str, value: Any, default: Any) -> None:
    """A setting's value has the kind of its default (bool, int, real number); reals are
    finite."""
    if name == "sigmas":  # a list whose values SamplerSettings checks
        ok = value is None or isinstance(value, list | tuple)
    elif isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int) or (default is None and name.endswith(("steps", "after"))):
        ok = _is_int(value) or (default is None and value is None)
    elif isinstance(default, float) or (default is None and name in REAL_OR_NONE):
        ok = (isinstance(value, int | float) and not isinstance(value, bool)
              and math.isfinite(value)) or (default is None and value is None)
    else:
        ok = True
    if not ok:
        kind = "a list of numbers or None" if name == "sigmas" else {
            bool: "true or false", int: "an integer", float: "a finite number"}.get(
            type(default), "a finite number or None" if name in REAL_OR_NONE
            else "an integer or None")
        raise ValueError(f"sampler setting {name}={value!r}: must be {kind}")


def check_settings(settings: SamplerSettings) -> SamplerSettings:
    """Every setting of the kind its default has, and settings consistent with each other."""
    for f in fields(settings):
        _check_value(f.name, getattr(settings, f.name), f.default)
    if settings.shift <= 0:
        raise ValueError(f"sampler setting shift={settings.shift!r}: must be positive")
    for name, most in (("steps", MAX_STEPS), ("leap_steps", MAX_STEPS),
                       ("num_train_timesteps", MAX_TRAIN_TIMESTEPS)):
        if getattr(settings, name) > most:
            raise ValueError(f"sampler setting {name}={getattr(settings, name)}: more than "
                             f"{most}")
    if abs(settings.guidance) > MAX_GUIDANCE:
        raise ValueError(f"sampler setting guidance={settings.guidance!r}: larger than "
                         f"{MAX_GUIDANCE:g} in size (far above any useful scale)")
    with np.errstate(all="ignore"):
        schedule = timesteps(settings)
    if not (np.isfinite(schedule).all() and (np.diff(schedule) < 0).all()):
        if settings.sigmas is not None:  # the given levels make the schedule, not the shift
            raise ValueError(f"sampler setting sigmas={list(settings.sigmas)!r:.120}: no usable "
                             "noise schedule (the levels, shifted, must fall, finite and "
                             "distinct)")
        terminal = ("" if settings.shift_terminal is None
                    else f", shift_terminal={settings.shift_terminal!r}")
        raise ValueError(f"sampler settings shift={settings.shift!r}, num_train_timesteps="
                         f"{settings.num_train_timesteps}{terminal}: no usable noise schedule "
                         "(its levels must fall from 1 to 0, finite and distinct)")
    merge = getattr(settings, "merge_steps", 0)
    if merge > settings.steps:
        raise ValueError(f"sampler setting merge_steps={merge}: more than steps="
                         f"{settings.steps} (merging applies to the first merge_steps steps)")
    return settings


def with_overrides(settings: SamplerSettings, overrides: dict[str, Any]) -> SamplerSettings:
    """`settings` with `overrides` applied and checked; unknown names are refused by name."""
    known = {f.name for f in fields(settings)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown sampler setting(s): {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(known))}")
    for name, value in overrides.items():  # before replace(): __post_init__ compares values
        _check_value(name, value, next(f.default for f in fields(settings) if f.name == name))
    overrides = dict(overrides)
    if overrides.get("sigmas") is not None:  # given levels say how many steps there are
        overrides.setdefault("steps", len(overrides["sigmas"]))
    elif "steps" in overrides and "sigmas" not in overrides and settings.sigmas is not None \
            and overrides["steps"] != len(settings.sigmas):
        raise ValueError(f"sampler setting steps={overrides['steps']}: these settings give "
                         f"{len(settings.sigmas)} noise levels of their own (sigmas); give "
                         "sigmas as well, or sigmas=None for the schedule's own spacing")
    return check_settings(replace(settings, **overrides))


def decode_values(decode: dict | None, timestep: float | None = None,
                  noise_scale: float | None = None) -> tuple[float, float]:
    """The decode timestep and noise scale a timestep-conditioned decoder is fed: each
    given value, else the package's default (the manifest's `decode`); a noise scale of
    None means the timestep's value, as LTXPipeline's decode_noise_scale=None does. Without
    `decode` the decoder takes neither and mixes in no noise: (0, 0)."""
    if decode is None:
        return 0.0, 0.0
    t = decode["timestep"] if timestep is None else timestep
    return t, next(v for v in (noise_scale, decode.get("noise_scale"), t) if v is not None)
