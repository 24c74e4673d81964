"""Named sets of the sampler's speed-ups (`edge generate --preset`), so a user picks a point
on the cost-quality curve without knowing every option. Each is stated relative to the
package's own step count, as the sweep's rows are (edge/eval/sweep.py), and measured on
tiny-sora side by side with the guided baseline (benchmarks/fewer_calls.py; the table is in
docs/benchmarks.md):

- `quality`: the package's sampler as exported (every step guided, no leap, merge or cache).
- `balanced`: the leap tail rule (after a fifth of the steps, the rest in a third of them)
  with temporal token merging for the first half of the steps (where the package has the
  merged variants): 2.37x fewer transformer FLOPs on tiny-sora, every accuracy within 0.021.
- `fast`: `balanced` with the step cache and guidance for the first third of the calls only:
  4.5x fewer FLOPs, colour and direction right in as many clips as the baseline. (The
  cutoff with the leap alone lost more shape than with merging and the cache: 0.062 on the
  held-out prompts.)

A package whose scheduler builds no re-planned tail (CogVideoX's DDIM) leaps in one step
only, which loses the video's colour on tiny-sora (docs/benchmarks.md): there the presets
leave the leap out. Options given beside a preset win over it.
"""

from __future__ import annotations

from edge.core.sampler import SamplerSettings
from edge.core.schedulers import SCHEDULERS

PRESETS = ("quality", "balanced", "fast")
# the step cache threshold of the presets and the sweep's rows (docs/benchmarks.md: chosen on
# held-out prompts)
CACHE_THRESHOLD = 0.1
# the leap tail rule (after, tail steps, of steps): tiny-sora's `--leap`, after 6 of 30 steps
# the rest in 10, scaled to a run's steps
TAIL_RULE = (6, 10, 30)


def tail_leap(steps: int, rule: tuple[int, int, int] = TAIL_RULE) -> dict:
    """The sampler overrides of the leap tail `rule` scaled to `steps`."""
    after, tail, of = rule
    return {"leap": True, "leap_after": max(1, round(steps * after / of)),
            "leap_steps": max(2, round(steps * tail / of))}


def guidance_cutoff(steps: int) -> dict:
    """Guidance for the first third of `steps` calls (at least one), the caption's half
    alone after."""
    return {"guidance_steps": max(1, steps // 3)}


def preset_overrides(name: str, settings: SamplerSettings, merges: bool) -> dict:
    """The sampler overrides preset `name` stands for on a package with these default
    `settings`; `merges`: whether the package has the merged (TDTM) transformer variants.
    An unknown name is refused naming the known ones."""
    if name not in PRESETS:
        raise ValueError(f"--preset {name!r}: known: {', '.join(PRESETS)}")
    steps = settings.steps
    off = {"leap": False, "leap_after": None, "leap_steps": 1, "merge_steps": 0,
           "cache_threshold": 0.0, "guidance_steps": None}
    if name == "quality":
        return off
    out = off | {"merge_steps": steps // 2 if merges else 0}
    if SCHEDULERS[settings.scheduler].leap_tail and steps >= 5:
        out |= tail_leap(steps)
    if name == "fast":
        out |= {"cache_threshold": CACHE_THRESHOLD} | guidance_cutoff(steps)
    return out
