"""The sampler loop every scheduler runs in, in plain NumPy: classifier-free guidance, step
leaping, the TDTM step switch and the step cache.

`sample()` integrates from t = 1 (noise) to t = 0 over the scheduler the settings name
(`scheduler`, a name of edge/core/schedulers.py `SCHEDULERS`: flow-match Euler, LTX-Video's
flow-match Euler, UniPC, CogVideoX's DDIM). The scheduler owns the noise levels, the model
times and the solver that steps through them; this loop calls the predictor once per step,
guides what it predicts (a flow's velocity v = noise - x0, DDIM's v-prediction) and hands that
to the solver; and it decides which transformer calls are made (below).

Guidance is classifier-free, v = v_uncond + g (v_cond - v_uncond), with the fixed scale
`guidance`, or, with the setting `dynamic_guidance`, CogVideoX's scale of each step's training
timestep (CogVideoXPipeline's use_dynamic_cfg; `step_guidance`); `guidance_rescale` then
pulls the guided velocity's spread back towards the conditional one's (LTXPipeline's
guidance_rescale; `rescaled_guidance`). A call is guided only with a scale over 1 (diffusers'
do_classifier_free_guidance: at or below 1 it runs no unconditional pass) and, with
`guidance_steps` K, only among the first K calls (the guidance cutoff); an unguided call
predicts the conditional velocity alone, a batch of one (`Step.guided`, `guided_call`).

Three ways to make fewer or cheaper transformer calls, all decided here (see
docs/techniques-in-edge.md):

- Linear Proportional Leap (`leap`): once consecutive velocities stop growing more aligned
  (or after a fixed number of steps), the rest of the way to t = 0 is covered in
  `leap_steps` steps instead of the schedule's remaining ones. With one, the leap is one
  step with the whole remaining time (the scheduler's `jump`: for a flow, x - t v, the
  predicted x0); with more, the remaining time is re-planned with the schedule's own
  spacing (the scheduler's `tail`, edge/core/schedulers.py).
- Temporal token merging (`merge_steps`): the predictor is told to use the merged transformer
  variant for the first `merge_steps` steps.
- Step cache (`cache_threshold`): the predictor skips the transformer pairs while the
  accumulated relative change of the first block's modulated input stays under the
  threshold, reusing the pairs' last residual.

This module imports no torch: the Python runtime uses it as is, and the JavaScript and Swift
runtimes mirror it line by line, so keep it plain array code. Every piece of state lives in
one `sample()` call, so generations never influence each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from edge.core.noise import torch_randn
from edge.core.schedulers import SCHEDULERS, Scheduler, scheduler_for


@dataclass(frozen=True)
class SamplerSettings:
    steps: int = 30
    guidance: float = 5.0
    # CogVideoXPipeline's use_dynamic_cfg: each step's guidance scale from its training
    # timestep (the function dynamic_guidance); only for a scheduler whose levels are those
    dynamic_guidance: bool = False
    # LTXPipeline's guidance_rescale (arXiv 2305.08891, 3.4): the guided velocity mixed with
    # itself rescaled to the conditional velocity's standard deviation; 0 is off
    guidance_rescale: float = 0.0
    shift: float = 3.0                 # SD3-style timestep shift: more steps at high noise
    num_train_timesteps: int = 1000
    scheduler: str = "flow_euler"      # a name of edge/core/schedulers.py SCHEDULERS
    # the last noise level before 0, the schedule stretched to end there (ltx_flow_euler's
    # shift_terminal); None: no stretch
    shift_terminal: float | None = None
    # Linear Proportional Leap
    leap: bool = False
    leap_after: int | None = None      # fixed mode: leap after this many steps; None: dynamic
    leap_min_steps: int = 15           # dynamic mode never leaps before this many steps
    leap_patience: int = 3             # steps that fail to improve the best cosine, then leap
    leap_tol: float = 1e-3             # an improvement must exceed this
    leap_steps: int = 1                # steps from the leap to t = 0 (1: straight to t = 0)
    # temporal token merging: the merged transformer variant for the first merge_steps steps
    merge_steps: int = 0
    # step cache: 0 is off; larger skips more transformer calls
    cache_threshold: float = 0.0
    # guidance cutoff: classifier-free guidance for the first guidance_steps calls, then the
    # conditional prediction alone (half the transformer work); None: every call
    guidance_steps: int | None = None
    # given levels: the `steps` noise levels a distilled model was trained for, falling in
    # (0, 1], in place of the schedule's own spacing, taken as diffusers' set_timesteps(
    # sigmas=...) takes them (shifted as the schedule shifts its own; edge/core/schedulers.py);
    # None: the schedule's own
    sigmas: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"sampler setting {name}={getattr(self, name)!r}: {why}")

        if isinstance(self.sigmas, list):  # from a manifest's JSON: kept as a tuple (frozen)
            object.__setattr__(self, "sigmas", tuple(self.sigmas))

        if self.scheduler not in SCHEDULERS:
            raise bad("scheduler", f"known: {', '.join(SCHEDULERS)}")
        if self.steps < 1:
            raise bad("steps", "must be at least 1")
        if self.dynamic_guidance and not SCHEDULERS[self.scheduler].takes_dynamic_guidance:
            takers = ", ".join(n for n, c in SCHEDULERS.items() if c.takes_dynamic_guidance)
            raise bad("dynamic_guidance", f"{self.scheduler} steps through no training "
                                          f"timesteps (only {takers} does; CogVideoX's "
                                          "dynamic guidance is a function of them)")
        r = self.guidance_rescale
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0 <= r <= 1:
            raise bad("guidance_rescale", "must be a number from 0 (off) to 1 (the guided "
                                          "velocity wholly rescaled)")
        if self.shift_terminal is not None:
            t = self.shift_terminal
            if not (isinstance(t, int | float) and not isinstance(t, bool) and 0 < t < 1):
                raise bad("shift_terminal", "must be a number between 0 and 1 (the last noise "
                                            "level before 0), or None for no stretch")
            if not SCHEDULERS[self.scheduler].takes_shift_terminal:
                takers = ", ".join(n for n, c in SCHEDULERS.items() if c.takes_shift_terminal)
                raise bad("shift_terminal", f"{self.scheduler} takes none (only {takers} "
                                            "stretches its schedule to a terminal level)")
        # a leap after steps - 1 or more steps never happens (the last step reaches t = 0
        # anyway), so a package's fixed leap stays valid when fewer steps are asked for
        if self.leap_after is not None and self.leap_after < 1:
            raise bad("leap_after", "must be at least 1")
        if self.leap_min_steps < 1:
            raise bad("leap_min_steps", "must be at least 1")
        if self.leap_patience < 1:
            raise bad("leap_patience", "must be at least 1")
        if self.leap_tol < 0:
            raise bad("leap_tol", "must not be negative")
        if self.leap_steps < 1:
            raise bad("leap_steps", "must be at least 1")
        if self.leap_steps > 1 and not SCHEDULERS[self.scheduler].leap_tail:
            raise bad("leap_steps", f"{self.scheduler} leaps in one step only (no re-planned "
                                    "tail is built for it)")
        if self.merge_steps < 0:
            raise bad("merge_steps", "must not be negative")
        if self.cache_threshold < 0:
            raise bad("cache_threshold", "must not be negative")
        k = self.guidance_steps
        if k is not None and (isinstance(k, bool) or not isinstance(k, int)
                              or not 0 <= k <= self.steps):
            raise bad("guidance_steps", f"must be a whole number from 0 to steps "
                                        f"({self.steps}), or None to guide every call")
        if self.sigmas is not None:
            self._check_sigmas(bad)

    def _check_sigmas(self, bad: Callable[[str, str], ValueError]) -> None:
        levels = self.sigmas
        if not SCHEDULERS[self.scheduler].takes_sigmas:
            takers = ", ".join(n for n, c in SCHEDULERS.items() if c.takes_sigmas)
            raise bad("sigmas", f"{self.scheduler} takes no given levels (its diffusers "
                                f"scheduler takes none either; {takers} do)")
        if not isinstance(levels, tuple) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                for v in levels):
            raise bad("sigmas", "must be a list of finite numbers, or None for the "
                                "schedule's own levels")
        if len(levels) != self.steps:
            raise bad("sigmas", f"{len(levels)} levels for steps={self.steps} (one level a "
                                "step)")
        outside = next((v for v in levels if not 0 < v <= 1), None)
        if outside is not None:
            raise bad("sigmas", f"{outside!r} is outside the schedule's range (0, 1]")
        rise = next((i for i in range(1, len(levels)) if levels[i] >= levels[i - 1]), None)
        if rise is not None:
            raise bad("sigmas", f"does not fall: level {rise} ({levels[rise]!r}) is not below "
                                f"level {rise - 1} ({levels[rise - 1]!r})")

    def to_dict(self) -> dict:
        values = asdict(self)
        if self.sigmas is not None:  # a manifest's JSON list
            values["sigmas"] = list(self.sigmas)
        return values

    @classmethod
    def from_dict(cls, values: dict) -> SamplerSettings:
        """From a manifest's `sampler` object; unknown keys are refused by name."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown sampler setting(s): {', '.join(unknown)}")
        return cls(**values)


def levels_from_text(text: str) -> tuple[float, ...]:
    """Noise levels written with commas between them ("1,0.94,0.75,0.4", as --sigmas takes
    them); what the values must be (falling, in (0, 1], one a step) `SamplerSettings` checks,
    naming the setting."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r}: give the noise levels as numbers with commas between "
                         "them, e.g. 1,0.94,0.75,0.4") from None


def scheduler_of(settings: SamplerSettings) -> Scheduler:
    return scheduler_for(settings.scheduler, settings.shift, settings.num_train_timesteps,
                         settings.shift_terminal)


def timesteps(settings: SamplerSettings) -> np.ndarray:
    """The noise levels t_0 = 1 > ... > t_{N-1} > t_N = 0 the sampler integrates over, float32
    of length steps + 1, as the settings' diffusers scheduler sets them."""
    return scheduler_of(settings).schedule(settings.steps, settings.sigmas)[0]


def model_times(settings: SamplerSettings) -> np.ndarray:
    """What the transformer is told the time of each step is (length steps): the sigmas for
    flow-match Euler; UniPC's whole training timesteps as fractions."""
    return scheduler_of(settings).schedule(settings.steps, settings.sigmas)[1]


def max_calls(settings: SamplerSettings) -> int:
    """The most transformer calls one generation can make: a leap's tail can be longer than
    the steps it replaces (a leap comes at the latest after steps - 2 steps)."""
    if not settings.leap:
        return settings.steps
    return max(settings.steps, settings.steps - 2 + settings.leap_steps)


def guided_call(settings: SamplerSettings, call: int) -> bool:
    """Whether transformer call `call` (0-based) is guided: a scale over 1, as diffusers'
    do_classifier_free_guidance, and the call before the cutoff (`guidance_steps`)."""
    return settings.guidance > 1 and (settings.guidance_steps is None
                                      or call < settings.guidance_steps)


def guided_velocity(v_cond: np.ndarray, v_uncond: np.ndarray, guidance: float) -> np.ndarray:
    return v_uncond + guidance * (v_cond - v_uncond)


def rescaled_guidance(v: np.ndarray, v_cond: np.ndarray, rescale: float) -> np.ndarray:
    """diffusers' rescale_noise_cfg: each sample's guided velocity v scaled to the standard
    deviation of its conditional velocity (over all its values, with Bessel's correction as
    torch.std), mixed with v by `rescale`; computed in float64, float32 out."""
    axes = tuple(range(1, v.ndim))
    v64, c64 = v.astype(np.float64), v_cond.astype(np.float64)
    ratio = c64.std(axis=axes, ddof=1, keepdims=True) / v64.std(axis=axes, ddof=1,
                                                                keepdims=True)
    return (rescale * (v64 * ratio) + (1 - rescale) * v64).astype(np.float32)


def dynamic_guidance(guidance: float, timestep: int, steps: int) -> float:
    """CogVideoXPipeline's guidance scale with use_dynamic_cfg at training timestep
    `timestep` (an integer) of a `steps`-step run, in Python floats as diffusers computes it:
    1 + guidance (1 - cos(pi ((steps - timestep) / steps) ** 5)) / 2. The formula mixes a
    timestep with a step count: wherever timestep > steps (most steps of a run: 999 against
    50) the base is negative (Python's `** 5.0` of it is minus the power of its size), and
    with timestep well over steps its fifth power is huge, so the cosine of that many half
    turns hangs on the power's last bits. The mirrors therefore compute `** 5.0` correctly
    rounded, as glibc's pow gives it for every pair the fixtures hold
    (tests/test_dynamic_guidance.py)."""
    return 1 + guidance * ((1 - math.cos(math.pi * ((steps - timestep) / steps) ** 5.0)) / 2)


def step_guidance(settings: SamplerSettings, level: float, steps: int) -> float:
    """The guidance scale of the step at scheduler level `level` of a `steps`-step schedule:
    `guidance`, or with `dynamic_guidance` CogVideoX's scale at that level (a training
    timestep). diffusers uses that scale only with a guidance_scale over 1 (at or below 1 it
    runs no guidance at all), so there the plain scale stays."""
    if settings.dynamic_guidance and settings.guidance > 1:
        return dynamic_guidance(settings.guidance, int(level), steps)
    return settings.guidance


def initial_noise(shape: tuple[int, ...], seeds: list[int]) -> np.ndarray:
    """Standard normal latents (B, *shape), sample i drawn as diffusers draws one sample for a
    generator seeded with seeds[i] (edge.core.noise)."""
    return np.stack([torch_randn(tuple(shape), s) for s in seeds])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity over the whole array (every sample, channel, frame, pixel), in
    float64."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    denom = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    return float(a64 @ b64) / denom if denom > 0 else 1.0


class LeapRule:
    """Decides, after each velocity prediction, whether to leap to t = 0 now.

    Dynamic: keep the best cosine of consecutive velocities seen so far; a step whose cosine
    does not beat it by more than `leap_tol` is a stale step; after `leap_patience` stale steps
    in a row, and once at least `leap_min_steps` steps are done, leap. Fixed (`leap_after`):
    leap once that many steps are done. `steps_done` counts the Euler steps already taken, so
    leaping after n steps makes n + 1 transformer calls."""

    def __init__(self, settings: SamplerSettings) -> None:
        self.settings = settings
        self.previous: np.ndarray | None = None
        self.best = -np.inf
        self.stale = 0
        self.cosines: list[float] = []

    def should_leap(self, v: np.ndarray, steps_done: int) -> bool:
        s = self.settings
        if self.previous is not None:
            c = cosine(v, self.previous)
            self.cosines.append(c)
            if c > self.best + s.leap_tol:
                self.best, self.stale = c, 0
            else:
                self.stale += 1
        self.previous = v
        if not s.leap or steps_done >= s.steps - 1:  # the last step reaches t = 0 anyway
            return False
        if s.leap_after is not None:
            return steps_done >= s.leap_after
        return steps_done >= s.leap_min_steps and self.stale >= s.leap_patience


def modulated_input(x: np.ndarray, t_mod: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """The first block's timestep-modulated input, from the prologue's outputs: LayerNorm of
    the tokens x (B, ..., D), scaled and shifted by the adaLN-single modulation t_mod
    (B, 6, D) rows 1 (scale) and 0 (shift). The block's own learned table offset is left out:
    it is a constant, and the step cache only compares this value between steps."""
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    h = (x64 - mean) / np.sqrt(var + eps)
    # rows broadcast over the token axes: (B, T, S, D) for tiny-sora, (B, S, D) for Wan
    rows = (x.shape[0], *(1,) * (x.ndim - 2), x.shape[-1])
    return h * (1.0 + t_mod[:, 1].reshape(rows)) + t_mod[:, 0].reshape(rows)


def relative_l1(a: np.ndarray, b: np.ndarray) -> float:
    """mean |a - b| / mean |b|."""
    denom = float(np.abs(b).mean())
    return float(np.abs(a - b).mean()) / denom if denom > 0 else np.inf


@dataclass
class StepCache:
    """TeaCache-style reuse of the transformer pairs' residual across steps.

    Each step the predictor reports the first block's modulated input (`modulated_input`);
    the relative L1 change against the previous step's accumulates; while the sum stays
    under `threshold` the pairs are skipped and x_after = x_before + the last computed
    residual (x_after - x_before). Computing resets the sum. The first and last steps always
    compute."""

    threshold: float
    previous: np.ndarray | None = None
    accumulated: float = 0.0
    residual: np.ndarray | None = None

    def should_compute(self, indicator: np.ndarray, force: bool = False) -> bool:
        change = np.inf if self.previous is None else relative_l1(indicator, self.previous)
        self.previous = indicator
        if force or self.residual is None:
            self.accumulated = 0.0
            return True
        self.accumulated += change
        if self.accumulated < self.threshold:
            return False
        self.accumulated = 0.0
        return True

    def store(self, before: np.ndarray, after: np.ndarray) -> None:
        self.residual = after - before

    def reuse(self, before: np.ndarray) -> np.ndarray:
        # after the guidance cutoff the batch is the caption's half alone: the first rows of
        # a residual stored on a guided call are that half's
        return (before + self.residual[:before.shape[0]]).astype(before.dtype)


@dataclass
class Step:
    """What the sampler tells the predictor about one transformer call."""

    index: int                    # 0-based call number
    merged: bool                  # use the temporally merged (TDTM) transformer variant
    cache: StepCache | None       # None: step cache off
    last: bool                    # the last call of this generation, as far as known now
    computed: bool = True         # set by run_pairs: False when the cache stood in
    # predict the unconditional velocity too (classifier-free guidance); False: the
    # conditional one alone, and the predictor returns None for the other
    guided: bool = True
    videos: int = 0               # the videos generated: the first rows of a call's batch


def run_pairs(step: Step, x: np.ndarray, t_mod: np.ndarray,
              pairs: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, bool]:
    """Run the transformer pairs on tokens x, or reuse the cached residual. Returns the
    tokens after the pairs and whether the pairs ran. The indicator is the caption half's
    (the first `step.videos` rows; the null half's rows are the same, the modulated input
    being the latent's and the time's), so a guided call and an unguided one, a batch of two
    or of one, measure the same change."""
    if step.cache is None:
        return pairs(x), True
    videos = step.videos or x.shape[0]
    residual = step.cache.residual
    short = residual is not None and residual.shape[0] < x.shape[0]  # cannot stand in
    if step.cache.should_compute(modulated_input(x[:videos], t_mod[:videos]),
                                 force=step.index == 0 or step.last or short):
        out = pairs(x)
        step.cache.store(x, out)
        return out, True
    step.computed = False
    return step.cache.reuse(x), False


@dataclass
class Trace:
    """What one `sample()` call did: for run figures and the JSON fixtures of the runtimes."""

    calls: int = 0                           # velocity predictions
    transformer_calls: int = 0               # of them, with the transformer pairs run
    leap_at: int | None = None               # steps done before the leap; None: no leap
    cosines: list[float] = field(default_factory=list)  # of consecutive guided velocities
    merged_calls: int = 0
    guided_calls: int = 0                    # with the unconditional half (guidance) run

    def to_dict(self) -> dict:
        return asdict(self)


# predict(latents, t, step) -> (v_cond, v_uncond); latents (B, ...) float32, t in [0, 1];
# v_uncond None where the step is not guided (step.guided)
Predictor = Callable[[np.ndarray, float, Step], tuple[np.ndarray, np.ndarray | None]]


def sample(predict: Predictor, noise: np.ndarray, settings: SamplerSettings,
           on_step: Callable[[int, int], None] | None = None,
           trace: Trace | None = None) -> np.ndarray:
    """Integrate from t=1 (noise) to t=0; returns the final latents. After a leap the loop
    goes on over the leap's tail (its own noise levels and model times, a fresh solver)
    until t = 0."""
    scheduler = scheduler_of(settings)
    ts, model_ts = scheduler.schedule(settings.steps, settings.sigmas)
    solver = scheduler.solver(ts)
    x = noise.astype(np.float32)
    trace = trace if trace is not None else Trace()
    rule = LeapRule(settings)
    cache = StepCache(settings.cache_threshold) if settings.cache_threshold > 0 else None
    # a fixed leap is known in advance, so the cache can treat its tail's end as the last call
    fixed_leap = settings.leap and settings.leap_after is not None \
        and settings.leap_after < settings.steps - 1
    last_call = (settings.leap_after + settings.leap_steps - 1 if fixed_leap
                 else settings.steps - 1)
    total = settings.steps     # calls this generation makes, as far as known now
    call = i = 0               # call: transformer calls so far; i: index into ts
    while i < len(ts) - 1:
        step = Step(call, call < settings.merge_steps, cache, call == last_call,
                    guided=guided_call(settings, call), videos=x.shape[0])
        v_cond, v_uncond = predict(x, float(model_ts[i]), step)
        trace.calls += 1
        trace.transformer_calls += step.computed
        trace.merged_calls += step.merged
        trace.guided_calls += step.guided
        v = v_cond
        if step.guided:
            # the step count of the schedule being run: `steps` with dynamic guidance, whose
            # scheduler never re-plans a tail; a leap's jump is guided as the step it replaces
            g = step_guidance(settings, ts[i], len(ts) - 1)
            v = guided_velocity(v_cond, v_uncond, g)
            if settings.guidance_rescale > 0:
                v = rescaled_guidance(v, v_cond, settings.guidance_rescale)
        if trace.leap_at is None and rule.should_leap(v, call):
            trace.leap_at = call
            if settings.leap_steps == 1:   # the whole remaining time in one step
                x = scheduler.jump(x, v, ts[i])
                call, total = call + 1, call + 1
                if on_step is not None:
                    on_step(total, total)
                break
            ts, model_ts = scheduler.tail(ts[i], ts[-2], settings.leap_steps)
            solver = scheduler.solver(ts)
            i, last_call, total = 0, call + settings.leap_steps - 1, call + settings.leap_steps
        x = solver.step(v, i, x)
        i, call = i + 1, call + 1
        if on_step is not None:
            on_step(call, total)
    trace.cosines = rule.cosines
    return x
