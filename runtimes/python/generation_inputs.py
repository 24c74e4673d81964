"""What a generation is given besides its prompts, checked and completed before anything
runs: initial noise in diffusers' layout, and a timestep-conditioned decoder's inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edge.core.noise import torch_randn_draws
from edge.core.options import decode_values


def checked_latents(latents: Any, want: tuple[int, ...]) -> np.ndarray:
    """Given initial noise as float32, refused unless a finite float array of `want`'s
    shape (diffusers' layout)."""
    if not isinstance(latents, np.ndarray) or latents.shape != want:
        got = latents.shape if isinstance(latents, np.ndarray) else type(latents).__name__
        raise ValueError(f"latents must be a NumPy array of shape {want} (batch, channels, "
                         f"frames, height, width; diffusers' layout), got {got}")
    if latents.dtype.kind != "f":  # ints, bools, complex, strings: no silent cast
        raise ValueError(f"latents must hold floating-point numbers (float32 or float64), "
                         f"got {latents.dtype}")
    if not np.isfinite(latents).all():
        raise ValueError("latents hold NaN or infinity")
    return latents.astype(np.float32)


def decode_conditioning(spec: dict | None, package: Path, latent_shape: tuple[int, ...],
                        seeds: list[int] | None, b: int, timestep: float | None,
                        noise_scale: float | None, noise: np.ndarray | None) -> dict:
    """The decoder's decode inputs, where the manifest has `decode` (`spec`) (else none, and
    giving any is refused): the timestep; the noise scale (given, else the manifest's,
    else the timestep's value, as diffusers' decode_noise_scale=None); the noise, given
    (B, *latent_shape), else for each seed the second `torch.randn(latent_shape)` of its
    generator (diffusers draws it from the pipeline's generator after the initial
    latents). Given latents need a given noise unless the scale is 0."""
    if spec is None:
        if any(v is not None for v in (timestep, noise_scale, noise)):
            raise ValueError(f"package {package}: its decoder takes no decode timestep "
                             "or noise (the manifest has no 'decode')")
        return {}
    for name, value in (("decode_timestep", timestep), ("decode_noise_scale", noise_scale)):
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, int | float)
                                  or not np.isfinite(value)):
            raise ValueError(f"{name} {value!r} must be a finite number")
    t, s = decode_values(spec, timestep, noise_scale)
    shape = (b, *latent_shape)
    if noise is not None:
        if not isinstance(noise, np.ndarray) or noise.shape != shape \
                or noise.dtype.kind != "f" or not np.isfinite(noise).all():
            raise ValueError(f"decode_noise must be a finite NumPy array of shape {shape} "
                             "holding floating-point numbers")
        noise = noise.astype(np.float32)
    elif s == 0:
        noise = np.zeros(shape, np.float32)  # mixed in with weight 0
    elif seeds is not None:
        noise = np.stack([torch_randn_draws([latent_shape] * 2, seed)[1]
                          for seed in seeds])
    else:
        raise ValueError(f"decode noise scale {s} with given latents: pass decode_noise "
                         "too (diffusers draws it from the pipeline's generator), or "
                         "decode_noise_scale=0")
    return {"decode_t": np.full(b, t, np.float32),
            "decode_noise_scale": np.full(b, s, np.float32), "decode_noise": noise}
