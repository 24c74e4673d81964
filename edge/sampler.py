"""Rectified-flow Euler sampler with classifier-free guidance, in plain NumPy.

Convention (diffusers' FlowMatchEulerDiscreteScheduler): x_t = (1 - t) * x0 + t * noise, the
model predicts v = noise - x0, and one Euler step is x_next = x + (t_next - t) * v.

This module imports no torch: the Python runtime uses it as is, and the JavaScript and Swift
runtimes mirror it line by line, so keep it plain array code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

# predict(latents, t) -> (v_cond, v_uncond); latents (B, ...) float32, t a scalar in [0, 1]
Predictor = Callable[[np.ndarray, float], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class SamplerSettings:
    steps: int = 30
    guidance: float = 5.0
    shift: float = 3.0                 # SD3-style timestep shift: more steps at high noise
    num_train_timesteps: int = 1000

    def to_dict(self) -> dict:
        return asdict(self)


def shift_sigmas(sigmas: np.ndarray, shift: float) -> np.ndarray:
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def timesteps(settings: SamplerSettings) -> np.ndarray:
    """The noise levels t_0 = 1 > ... > t_{N-1} > t_N = 0, float32 of length steps + 1.

    Reproduces FlowMatchEulerDiscreteScheduler.set_timesteps with a static shift: a linspace
    from 1 to the (shifted) smallest training sigma, shifted once more, then a final 0."""
    n_train = settings.num_train_timesteps
    sigma_min = shift_sigmas(np.float64(1.0 / n_train), settings.shift)
    sigmas = np.linspace(1.0, sigma_min, settings.steps)
    sigmas = shift_sigmas(sigmas.astype(np.float32), settings.shift)
    return np.append(sigmas, np.float32(0.0)).astype(np.float32)


def guided_velocity(v_cond: np.ndarray, v_uncond: np.ndarray, guidance: float) -> np.ndarray:
    return v_uncond + guidance * (v_cond - v_uncond)


def euler_step(x: np.ndarray, v: np.ndarray, t: float, t_next: float) -> np.ndarray:
    return (x + (np.float32(t_next) - np.float32(t)) * v).astype(np.float32)


def initial_noise(shape: tuple[int, ...], seeds: list[int]) -> np.ndarray:
    """Standard normal latents, one independent PCG64 stream per sample's seed."""
    return np.stack([np.random.default_rng(s).standard_normal(shape, dtype=np.float32)
                     for s in seeds])


def sample(predict: Predictor, noise: np.ndarray, settings: SamplerSettings,
           on_step: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Integrate from t=1 (noise) to t=0; returns the final latents."""
    ts = timesteps(settings)
    x = noise.astype(np.float32)
    for i in range(settings.steps):
        v_cond, v_uncond = predict(x, float(ts[i]))
        x = euler_step(x, guided_velocity(v_cond, v_uncond, settings.guidance), ts[i], ts[i + 1])
        if on_step is not None:
            on_step(i + 1, settings.steps)
    return x
