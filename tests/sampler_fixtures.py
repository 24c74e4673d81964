"""JSON fixtures of the sampler's decisions, for the runtimes that mirror edge/core/sampler.py
(JavaScript, Swift): each replays a recorded velocity or indicator sequence and must reach
the same decisions and numbers. `python tests/sampler_fixtures.py` rewrites them;
tests/test_leap.py checks that they still match this implementation.

Leap fixtures: the predictor ignores its input and returns velocities[i] at call i (cond =
uncond, so guidance changes nothing); expected are the calls, the leap step, the cosines,
the time each call was told (a leap's tail re-plans them) and the final latent. Guidance
fixtures (`uncond_velocities` given): the unconditional prediction differs, so guidance
counts; expected also says which calls were guided (the guidance cutoff). Cache
fixtures: indicators[i] is the first block's modulated input at call i; expected is, per
call, whether the pairs are computed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edge.core.sampler import SamplerSettings, StepCache, Trace, sample

FIXTURES = Path(__file__).parent / "fixtures" / "sampler"


def rotating_velocities(angles: list[float]) -> np.ndarray:
    """Unit 2-vectors at the given angles, as (steps, 1, 2) velocities."""
    a = np.asarray(angles, np.float64)
    return np.stack([np.cos(a), np.sin(a)], -1)[:, None].astype(np.float32)


def straight(steps: int = 12) -> np.ndarray:
    return np.tile(np.array([[[0.6, -0.8]]], np.float32), (steps, 1, 1))


def curving_then_straight(steps: int = 12, bend_until: int = 8, tol: float = 1e-3) -> np.ndarray:
    """Consecutive cosines rise by 4 * tol per step up to call `bend_until`, then stay."""
    cos = [0.95 + 4 * tol * min(i, bend_until) for i in range(1, steps)]
    angles = np.concatenate([[0.0], np.cumsum(np.arccos(cos))])
    return rotating_velocities(list(angles))


def replay_leap(settings: SamplerSettings, velocities: np.ndarray, noise: np.ndarray,
                uncond: np.ndarray | None = None):
    trace, times, guided = Trace(), [], []
    uncond = velocities if uncond is None else uncond

    def predict(x, t, step):
        times.append(t)
        guided.append(step.guided)
        return velocities[step.index][None], (uncond[step.index][None] if step.guided
                                              else None)

    out = sample(predict, noise[None], settings, trace=trace)
    trace.times, trace.guided = times, guided  # not Trace fields: the fixtures' own record
    return out[0], trace


def replay_cache(threshold: float, indicators: np.ndarray) -> list[bool]:
    cache, computed = StepCache(threshold), []
    for i, ind in enumerate(indicators):
        do = cache.should_compute(ind, force=i == 0 or i == len(indicators) - 1)
        if do:
            cache.store(np.zeros_like(ind), np.ones_like(ind))
        computed.append(do)
    return computed


def leap_cases() -> dict[str, tuple[SamplerSettings, np.ndarray]]:
    common = {"steps": 12, "guidance": 1.0, "leap_min_steps": 4, "leap_patience": 2,
              "leap_tol": 1e-3}
    return {
        "leap_straight_dynamic": (SamplerSettings(leap=True, **common), straight()),
        "leap_curved_dynamic": (SamplerSettings(leap=True, **common), curving_then_straight()),
        "leap_fixed": (SamplerSettings(leap=True, leap_after=5, **common),
                       curving_then_straight()),
        "leap_off": (SamplerSettings(leap=False, **common), curving_then_straight()),
        # the leap's tail: the remaining time re-planned in a few steps
        "leap_fixed_tail": (SamplerSettings(leap=True, leap_after=3, leap_steps=4, **common),
                            curving_then_straight()),
        "leap_dynamic_tail": (SamplerSettings(leap=True, leap_steps=3, **common),
                              curving_then_straight(bend_until=5)),
    }


def guidance_cases() -> dict[str, tuple[SamplerSettings, np.ndarray, np.ndarray]]:
    """The unconditional velocities point elsewhere, so each guided call moves the latent."""
    cond, uncond = curving_then_straight(), straight() * np.float32(0.5)
    return {
        "guidance_cutoff": (SamplerSettings(steps=8, guidance=5.0, guidance_steps=3),
                            cond, uncond),
        # diffusers guides only above 1: at 0.5 no call is guided
        "guidance_below_one": (SamplerSettings(steps=6, guidance=0.5), cond, uncond),
        # the cutoff falls inside a fixed leap's tail; the calls go on counting there
        "guidance_cutoff_leap": (SamplerSettings(steps=12, guidance=3.0, guidance_steps=5,
                                                 leap=True, leap_after=3, leap_steps=4),
                                 cond, uncond),
        # given noise levels (a distilled model's) in place of the schedule's spacing
        "given_sigmas": (SamplerSettings(steps=8, guidance=5.0, sigmas=(
            1.0, 0.97, 0.9, 0.8, 0.6, 0.45, 0.3, 0.1)), cond, uncond),
        # shifted given levels, a fixed leap re-planning the rest from them, a cutoff (the
        # schedules' exact levels with UniPC and LTX's: tests/fixtures/swift/schedulers.json)
        "given_sigmas_leap": (SamplerSettings(
            steps=6, guidance=4.0, shift=5.0, leap=True, leap_after=2, leap_steps=3,
            guidance_steps=4, sigmas=(0.99, 0.9, 0.7, 0.5, 0.3, 0.2)), cond, uncond),
    }


def cache_indicators() -> np.ndarray:
    # relative L1 changes of 0.05, 0.05, 0.2, 0.01 x 4, 0.3, ...: a ramp of scales
    scales = np.cumprod([1.0, 1.05, 1.05, 1.2, 1.01, 1.01, 1.01, 1.01, 1.3, 1.02, 1.02])
    return (scales[:, None] * np.linspace(1, 2, 6)[None]).astype(np.float64)


def build() -> dict[str, dict]:
    noise = np.array([[1.0, 2.0]], np.float32)
    out = {}
    for name, (settings, velocities) in leap_cases().items():
        x, trace = replay_leap(settings, velocities, noise)
        out[name] = {"settings": settings.to_dict(), "noise": noise.tolist(),
                     "velocities": velocities.tolist(),
                     "expected": {"calls": trace.calls, "leap_at": trace.leap_at,
                                  "cosines": trace.cosines, "times": trace.times,
                                  "latent": x.tolist()}}
    for name, (settings, velocities, uncond) in guidance_cases().items():
        x, trace = replay_leap(settings, velocities, noise, uncond)
        out[name] = {"settings": settings.to_dict(), "noise": noise.tolist(),
                     "velocities": velocities.tolist(), "uncond_velocities": uncond.tolist(),
                     "expected": {"calls": trace.calls, "leap_at": trace.leap_at,
                                  "cosines": trace.cosines, "times": trace.times,
                                  "guided": trace.guided, "guided_calls": trace.guided_calls,
                                  "latent": x.tolist()}}
    indicators = cache_indicators()
    out["cache"] = {"threshold": 0.12, "indicators": indicators.tolist(),
                    "expected": {"computed": replay_cache(0.12, indicators)}}
    return out


if __name__ == "__main__":
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, data in build().items():
        (FIXTURES / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
        print(FIXTURES / f"{name}.json")
