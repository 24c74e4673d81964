"""The noise schedules and update rules the shared sampler (edge/core/sampler.py) integrates with.

One class per scheduler, looked up by the manifest's `sampler.scheduler` (`SCHEDULERS`,
`scheduler_for`), with one small interface (`Scheduler`): the levels and model times of a
step count, the solver that steps through them, and what a leap asks (the re-planned tail,
the jump to the end). The JavaScript (runtimes/web/schedulers.js) and Swift
(Schedulers.swift) runtimes mirror the same classes. Each is a NumPy mirror of a diffusers
scheduler with the same numbers (tested step by step against it, tests/test_sampler.py):

- `flow_euler`: FlowMatchEulerDiscreteScheduler with a static shift (tiny-sora).
- `ltx_flow_euler`: FlowMatchEulerDiscreteScheduler as LTXPipeline sets it (LTX-Video): its
  own sigmas linspace(1, 1/N, N), the exponential time shift by mu (use_dynamic_shifting),
  then stretched so the last level is `shift_terminal` (bit-exact). The manifest's `shift`
  carries exp(mu): with the time-shift exponent 1 the exponential shift is the static shift
  by exp(mu), so an export computes it once from its token count (`ltx_mu`, as LTXPipeline's
  calculate_shift) and the runtimes need no sequence length.
- `flow_unipc`: UniPCMultistepScheduler as Wan 2.1 configures it: flow prediction, flow
  sigmas with `flow_shift`, order 2, the bh2 variant, predictor-corrector, first order at the
  last step. An order-2 multistep method: an Euler sampler does not reproduce it.
- `cogvideox_ddim`: CogVideoXDDIMScheduler as CogVideoX ships it (v-prediction, zero terminal
  SNR, trailing timesteps; bit-exact), for the CogVideoX family.
- `rflow`: Open-Sora 1.2's RFLOW sampler (not a diffusers scheduler): levels (1 - i/N) for
  i < N moved by the static ratio r of the video's size (the manifest's `shift`) as
  r s / (1 + (r - 1) s), then 0, stepped by Euler: FlowMatchEulerDiscreteScheduler with that
  static shift given those levels (bit-exact), flow_euler's arithmetic with LTX's spacing;
  within float32 rounding of Open-Sora's own formula (tests/test_opensora.py).

Given levels (`schedule(steps, sigmas)`): a distilled model is run at the levels it was
trained for, a list that replaces the schedule's own even spacing. The three flows take it as
their diffusers twin's `set_timesteps(sigmas=...)` does (`takes_sigmas`): the list is shifted
as the schedule shifts its own (the static shift, exp(mu), UniPC's flow_shift), stretched to
the terminal level where there is one, then 0 appended. CogVideoX's DDIM takes none, as
CogVideoXDDIMScheduler takes none.

The flows take the model's velocity v = noise - x0 (x_t = (1 - t) x0 + t noise), DDIM its
v-prediction. A scheduler's `model_times` are what the transformer is told the time is, in
[0, 1]; UniPC rounds its timesteps down to whole training steps (diffusers keeps them as
int64), so they differ slightly from its sigmas. No torch here: the runtimes use this module
as it is.
"""
from __future__ import annotations

import numpy as np


def shift_sigmas(sigmas: np.ndarray, shift: float) -> np.ndarray:
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def unshift_sigmas(sigmas: np.ndarray, shift: float) -> np.ndarray:
    """The inverse of shift_sigmas: where a shifted noise level sits on the even grid."""
    return sigmas / (shift - (shift - 1) * sigmas)


def leap_tail_sigmas(t_from: float, t_min: float, steps: int, shift: float) -> np.ndarray:
    """`steps` steps from t_from down to t_min, spaced as the shifted schedules space theirs
    (even before the shift), then a final 0 (float32, length steps + 1)."""
    even = np.linspace(unshift_sigmas(np.float64(t_from), shift),
                       unshift_sigmas(np.float64(t_min), shift), steps)
    return np.append(shift_sigmas(even, shift), 0.0).astype(np.float32)


def ltx_mu(tokens: int, base_seq: int, max_seq: int, base_shift: float,
           max_shift: float) -> float:
    """diffusers' calculate_shift, as LTXPipeline calls it with its scheduler config: the mu
    of `tokens` latent tokens (frames x height x width), on the line through (base_seq,
    base_shift) and (max_seq, max_shift), float64. LTX-Video 0.9.x's config gives 1024,
    4096, 0.95, 2.05 (LTXPipeline's fallbacks, where a config has none: 256, 4096, 0.5,
    1.15). The manifest's `shift` for `ltx_flow_euler` is math.exp of it."""
    slope = (max_shift - base_shift) / (max_seq - base_seq)
    return tokens * slope + (base_shift - slope * base_seq)


def ltx_sigmas(steps: int, shift: float, shift_terminal: float | None,
               given: np.ndarray | None = None) -> np.ndarray:
    """FlowMatchEulerDiscreteScheduler.set_timesteps as LTXPipeline calls it, op for op in
    float32 as diffusers computes on its float32 array: linspace(1, 1/N, N) (or the `given`
    levels), the exponential time shift e / (e + (1 / s - 1)) with e = exp(mu) = `shift`, then
    (with a terminal) 1 - s scaled so the last level is `shift_terminal`; a final 0. A
    schedule whose last level is 1 (one step) keeps it: there the stretch divides 0 by 0
    (diffusers gives NaN)."""
    one, e = np.float32(1), np.float32(shift)
    levels = np.linspace(1.0, 1.0 / steps, steps) if given is None else given
    sigmas = np.asarray(levels, np.float64).astype(np.float32)
    sigmas = e / (e + (one / sigmas - one))
    if shift_terminal is not None and sigmas[-1] != one:
        rest = one - sigmas
        # diffusers: 1 - shift_terminal in float64, then float32 against the array
        scale = rest[-1] / np.float32(1 - shift_terminal)
        sigmas = one - rest / scale
    return np.append(sigmas, np.float32(0)).astype(np.float32)


def whole_step_times(sigmas: np.ndarray, num_train_timesteps: int) -> np.ndarray:
    """UniPC's model times: each sigma rounded down to a whole training step, as a fraction."""
    whole = (sigmas.astype(np.float64) * num_train_timesteps).astype(np.int64)
    return (whole / num_train_timesteps).astype(np.float32)


def euler_sigmas(steps: int, shift: float, num_train_timesteps: int,
                 given: np.ndarray | None = None) -> np.ndarray:
    """FlowMatchEulerDiscreteScheduler.set_timesteps with a static shift: a linspace from 1 to
    the (shifted) smallest training sigma (or the `given` levels), shifted once more, then a
    final 0 (float32)."""
    if given is None:
        sigma_min = shift_sigmas(np.float64(1.0 / num_train_timesteps), shift)
        given = np.linspace(1.0, sigma_min, steps)
    sigmas = shift_sigmas(np.asarray(given, np.float64).astype(np.float32), shift)
    return np.append(sigmas, np.float32(0.0)).astype(np.float32)


def _unipc_flow_sigmas(steps: int, shift: float, num_train_timesteps: int,
                       given: np.ndarray | None = None) -> np.ndarray:
    """UniPCMultistepScheduler.set_timesteps with use_flow_sigmas, float64 and without the
    final 0: linspace(1, 1/N, steps + 1) without its end (or the `given` levels), shifted,
    the first nudged below 1."""
    levels = (np.linspace(1.0, 1.0 / num_train_timesteps, steps + 1)[:-1] if given is None
              else np.array(given, np.float64))
    sigmas = shift_sigmas(levels, shift)
    if abs(sigmas[0] - 1.0) < 1e-6:
        sigmas[0] -= 1e-6
    return sigmas


def unipc_sigmas(steps: int, shift: float, num_train_timesteps: int,
                 given: np.ndarray | None = None) -> np.ndarray:
    """UniPC's flow sigmas with a final 0, float32 as diffusers keeps them."""
    sigmas = _unipc_flow_sigmas(steps, shift, num_train_timesteps, given)
    return np.append(sigmas, 0.0).astype(np.float32)


def unipc_model_times(steps: int, shift: float, num_train_timesteps: int,
                      given: np.ndarray | None = None) -> np.ndarray:
    """The timesteps diffusers hands the model, int64(sigma * N) of the float64 sigmas, as
    fractions of N (float32)."""
    return whole_step_times(_unipc_flow_sigmas(steps, shift, num_train_timesteps, given),
                            num_train_timesteps)


def _lambda(sigma: np.float32) -> np.float32:
    """log(alpha / sigma) of a flow sigma (alpha = 1 - sigma); +inf at sigma = 0."""
    with np.errstate(divide="ignore"):
        return np.float32(np.log(np.float32(1) - sigma) - np.log(sigma))


class UniPCFlow:
    """One generation's UniPC state (order 2, bh2, predicting x0). `step(v, i, x)` takes the
    guided velocity at sigmas[i] and returns the sample at sigmas[i + 1]; the scalars are
    float32 as in diffusers, where they are float32 tensors."""

    order = 2

    def __init__(self, sigmas: np.ndarray) -> None:
        self.sigmas = sigmas.astype(np.float32)
        self.x0_history: list[np.ndarray] = []      # the last `order` converted outputs
        self.last_sample: np.ndarray | None = None
        self.last_order = 0

    def _coefficients(self, i_s0: int, i_t: int) -> tuple[np.float32, ...]:
        """alpha_t, sigma_t / sigma_s0, h_phi_1 = expm1(-h) and h for a step from sigmas[i_s0]
        to sigmas[i_t]. With bh2, B_h is h_phi_1 too."""
        sigma_t, sigma_s0 = self.sigmas[i_t], self.sigmas[i_s0]
        h = _lambda(sigma_t) - _lambda(sigma_s0)
        h_phi_1 = np.float32(np.expm1(np.float32(-h)))
        return np.float32(1) - sigma_t, np.float32(sigma_t / sigma_s0), h_phi_1, h

    def _rk(self, i_si: int, i_s0: int, h: np.float32) -> np.float32:
        return np.float32((_lambda(self.sigmas[i_si]) - _lambda(self.sigmas[i_s0])) / h)

    def _b_terms(self, h: np.float32, order: int) -> list[np.float32]:
        """b_k = h_phi_k * k! / B_h for k = 1..order (bh2: B_h = expm1(-h))."""
        hh = np.float32(-h)
        h_phi_1 = np.float32(np.expm1(hh))
        h_phi_k = np.float32(h_phi_1 / hh - 1)
        factorial, b = 1, []
        for k in range(1, order + 1):
            b.append(np.float32(h_phi_k * factorial / h_phi_1))
            factorial *= k + 1
            h_phi_k = np.float32(h_phi_k / hh - np.float32(1 / factorial))
        return b

    def _correct(self, x0: np.ndarray, i: int, x: np.ndarray) -> np.ndarray:
        """UniC: refine the sample at sigmas[i] with the new x0 prediction."""
        order = self.last_order
        m0 = self.x0_history[-1]
        alpha_t, ratio, h_phi_1, h = self._coefficients(i - 1, i)
        if order == 1:
            rhos = [np.float32(0.5)]
            d1s = []
        else:  # order 2: one earlier output, solve the 2x2 system R rho = b
            rk = self._rk(i - 2, i - 1, h)
            d1s = [(self.x0_history[-2] - m0) / rk]
            b = self._b_terms(h, 2)
            rhos = [np.float32(r) for r in np.linalg.solve(
                np.array([[1.0, 1.0], [rk, 1.0]], np.float32), np.array(b, np.float32))]
        x_t_ = ratio * self.last_sample - alpha_t * h_phi_1 * m0
        corr = sum((r * d for r, d in zip(rhos[:-1], d1s, strict=True)), np.float32(0))
        out = x_t_ - alpha_t * h_phi_1 * (corr + rhos[-1] * (x0 - m0))
        return out.astype(np.float32)

    def _predict(self, i: int, x: np.ndarray, order: int) -> np.ndarray:
        """UniP: the sample at sigmas[i + 1]."""
        m0 = self.x0_history[-1]
        alpha_t, ratio, h_phi_1, h = self._coefficients(i, i + 1)
        x_t_ = ratio * x - alpha_t * h_phi_1 * m0
        if order == 1:
            return x_t_.astype(np.float32)
        rk = self._rk(i - 1, i, h)
        d1 = (self.x0_history[-2] - m0) / rk
        return (x_t_ - alpha_t * h_phi_1 * (np.float32(0.5) * d1)).astype(np.float32)

    def step(self, v: np.ndarray, i: int, x: np.ndarray) -> np.ndarray:
        x0 = (x - self.sigmas[i] * v).astype(np.float32)
        if i > 0 and self.last_sample is not None:
            x = self._correct(x0, i, x)
        self.x0_history = (self.x0_history + [x0])[-self.order:]
        steps = len(self.sigmas) - 1
        order = min(self.order, steps - i, len(self.x0_history))
        self.last_sample, self.last_order = x, order
        return self._predict(i, x, order)


# ---- the schedulers as objects -------------------------------------------------------------


class EulerSolver:
    """Flow-match Euler through `sigmas`: x + (sigma_next - sigma) v, float32."""

    def __init__(self, sigmas: np.ndarray) -> None:
        self.sigmas = sigmas.astype(np.float32)

    def step(self, v: np.ndarray, i: int, x: np.ndarray) -> np.ndarray:
        return euler_step(x, v, self.sigmas[i], self.sigmas[i + 1])


def euler_step(x: np.ndarray, v: np.ndarray, sigma: float, sigma_next: float) -> np.ndarray:
    """One Euler step of a flow: x + (sigma_next - sigma) v (to 0: x - sigma v, the x0 the
    velocity predicts)."""
    return (x + (np.float32(sigma_next) - np.float32(sigma)) * v).astype(np.float32)


class Scheduler:
    """What the sampler asks of a scheduler. `name` is the manifest's `sampler.scheduler`;
    `leap_tail`: whether `tail` re-plans a leap's rest in several steps (else a leap is one
    `jump`, and a leap_steps over 1 is refused with the settings)."""

    name: str
    leap_tail = True
    # whether the schedule takes a `shift_terminal` (SamplerSettings refuses one otherwise)
    takes_shift_terminal = False
    # whether its levels are whole training timesteps, which CogVideoX's dynamic guidance
    # formula reads (edge/core/sampler.py dynamic_guidance; SamplerSettings refuses it otherwise)
    takes_dynamic_guidance = False
    # whether given levels can replace its own spacing (the module's docstring;
    # SamplerSettings refuses `sigmas` otherwise)
    takes_sigmas = False

    def __init__(self, shift: float, num_train_timesteps: int,
                 shift_terminal: float | None = None) -> None:
        self.shift = shift
        self.num_train_timesteps = num_train_timesteps
        self.shift_terminal = shift_terminal

    def schedule(self, steps: int, sigmas=None) -> tuple[np.ndarray, np.ndarray]:
        """The levels of `steps` steps (float32, falling, length steps + 1; a flow's are its
        noise levels 1 > ... > 0) and what the transformer is told the time of each is (length
        steps, in [0, 1]). `sigmas`: `steps` given levels in place of the schedule's own
        spacing (only where `takes_sigmas`), as its diffusers twin's set_timesteps(sigmas=)
        takes them."""
        raise NotImplementedError

    def tail(self, t_from: float, t_min: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """A leap's re-planned rest: `steps` steps from t_from down to t_min spaced as this
        schedule spaces its own, then 0; and their model times."""
        raise NotImplementedError

    def solver(self, sigmas: np.ndarray):
        """One generation's stepping through `sigmas`: an object whose `step(v, i, x)` takes
        the guided velocity at sigmas[i] and returns the sample at sigmas[i + 1]."""
        raise NotImplementedError

    def jump(self, x: np.ndarray, v: np.ndarray, sigma: float) -> np.ndarray:
        """A one-step leap from `sigma` straight to the end: the clean sample the velocity
        predicts."""
        return euler_step(x, v, sigma, 0.0)


class FlowEuler(Scheduler):
    """FlowMatchEulerDiscreteScheduler with a static shift (tiny-sora)."""

    name = "flow_euler"
    takes_sigmas = True

    def schedule(self, steps: int, sigmas=None) -> tuple[np.ndarray, np.ndarray]:
        levels = euler_sigmas(steps, self.shift, self.num_train_timesteps, sigmas)
        return levels, levels[:-1]

    def tail(self, t_from: float, t_min: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        sigmas = leap_tail_sigmas(t_from, t_min, steps, self.shift)
        return sigmas, sigmas[:-1]

    def solver(self, sigmas: np.ndarray) -> EulerSolver:
        return EulerSolver(sigmas)


class FlowUniPC(Scheduler):
    """UniPCMultistepScheduler as Wan 2.1 configures it (see the module's docstring): model
    times are whole training steps."""

    name = "flow_unipc"
    takes_sigmas = True

    def schedule(self, steps: int, sigmas=None) -> tuple[np.ndarray, np.ndarray]:
        return (unipc_sigmas(steps, self.shift, self.num_train_timesteps, sigmas),
                unipc_model_times(steps, self.shift, self.num_train_timesteps, sigmas))

    def tail(self, t_from: float, t_min: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        sigmas = leap_tail_sigmas(t_from, t_min, steps, self.shift)
        return sigmas, whole_step_times(sigmas[:-1], self.num_train_timesteps)

    def solver(self, sigmas: np.ndarray) -> UniPCFlow:
        return UniPCFlow(sigmas)


class FlowEulerLTX(FlowEuler):
    """FlowMatchEulerDiscreteScheduler as LTXPipeline sets it (`ltx_sigmas`: `shift` is
    exp(mu), `shift_terminal` the last level before 0, None for no stretch); model times are
    the sigmas (diffusers' timesteps are them times 1000). Its steps and a leap's tail are
    flow_euler's: the tail evenly spaced before the shift by exp(mu) from t_from to t_min,
    then 0. The terminal stretch is not applied again: it is an affine map of 1 - sigma
    fixed by the whole schedule's step count, and both ends of the tail are levels of the
    stretched schedule."""

    name = "ltx_flow_euler"
    takes_shift_terminal = True

    def schedule(self, steps: int, sigmas=None) -> tuple[np.ndarray, np.ndarray]:
        levels = ltx_sigmas(steps, self.shift, self.shift_terminal, sigmas)
        return levels, levels[:-1]


class RFlow(FlowEuler):
    """Open-Sora 1.2's RFLOW (the module's docstring): `shift` is the size's ratio r; its
    own levels are (1 - i/N), shifted as given ones are. The opensora family's transformer
    gives the flows' velocity noise - x0 (Open-Sora's model predicts its negative)."""

    name = "rflow"

    def schedule(self, steps: int, sigmas=None) -> tuple[np.ndarray, np.ndarray]:
        given = np.linspace(1.0, 1.0 / steps, steps) if sigmas is None else sigmas
        levels = euler_sigmas(steps, self.shift, self.num_train_timesteps, given)
        return levels, levels[:-1]


def rescale_zero_terminal_snr(alphas_cumprod: np.ndarray) -> np.ndarray:
    """Lin et al.'s rescale: the last timestep's signal to zero, the first's kept (diffusers'
    `rescale_zero_terminal_snr` of the DDIM schedulers, float64)."""
    root = np.sqrt(alphas_cumprod)
    first, last = root[0], root[-1]
    root = (root - last) * (first / (first - last))
    return root ** 2


class DDIMSolver:
    """diffusers' DDIM step (eta 0) on a v-prediction: from timestep t to t - stride (the
    clean end past 0): x0 = sqrt(a_t) x - sqrt(1 - a_t) v, then x' = A x + B x0. The scalars
    are float64, as diffusers keeps alphas_cumprod; each product is float32, as torch
    multiplies a float32 sample by a 0-d float64 tensor."""

    def __init__(self, timesteps: np.ndarray, alphas_cumprod: np.ndarray, stride: int) -> None:
        self.timesteps = timesteps.astype(np.int64)
        self.alphas_cumprod, self.stride = alphas_cumprod, stride

    def alpha(self, t: int) -> np.float64:
        return self.alphas_cumprod[t] if t >= 0 else np.float64(1.0)  # set_alpha_to_one

    def step(self, v: np.ndarray, i: int, x: np.ndarray) -> np.ndarray:
        t = int(self.timesteps[i])
        a_t, a_prev = self.alpha(t), self.alpha(t - self.stride)
        x0 = ddim_x0(x, v, a_t)
        a = np.sqrt((1 - a_prev) / (1 - a_t))
        b = np.sqrt(a_prev) - np.sqrt(a_t) * a
        return (np.float32(a) * x + np.float32(b) * x0).astype(np.float32)


def ddim_x0(x: np.ndarray, v: np.ndarray, alpha: np.float64) -> np.ndarray:
    """The clean sample a v-prediction gives at a level of alphas_cumprod `alpha`."""
    return (np.float32(np.sqrt(alpha)) * x - np.float32(np.sqrt(1 - alpha)) * v).astype(
        np.float32)


class CogVideoXDDIM(Scheduler):
    """`CogVideoXDDIMScheduler` as CogVideoX ships it: v-prediction, scaled-linear betas from
    0.00085 to 0.012, the SNR shift of SD3 by `shift` (diffusers' `snr_shift_scale`), zero
    terminal SNR, trailing timesteps, eta 0, the final alpha 1. Its levels are its training
    timesteps, then -1 for the clean end; like diffusers it steps from t to t - N // steps,
    which is not always the next timestep of its own list (steps that do not divide N). A leap
    is one jump to the clean sample the v-prediction gives; a re-planned DDIM tail is not
    built (`leap_tail` False)."""

    name = "cogvideox_ddim"
    leap_tail = False
    takes_dynamic_guidance = True
    beta_start, beta_end = 0.00085, 0.012

    def __init__(self, shift: float, num_train_timesteps: int,
                 shift_terminal: float | None = None) -> None:
        super().__init__(shift, num_train_timesteps, shift_terminal)
        betas = np.linspace(self.beta_start ** 0.5, self.beta_end ** 0.5, num_train_timesteps,
                            dtype=np.float64) ** 2
        alphas_cumprod = np.cumprod(1.0 - betas)
        alphas_cumprod = alphas_cumprod / (shift + (1 - shift) * alphas_cumprod)
        self.alphas_cumprod = rescale_zero_terminal_snr(alphas_cumprod)

    def timesteps(self, steps: int) -> np.ndarray:
        """diffusers' trailing spacing: round(arange(N, 0, -N / steps)) - 1."""
        n = self.num_train_timesteps
        return np.round(np.arange(n, 0, -n / steps)).astype(np.int64) - 1

    def schedule(self, steps: int, sigmas=None) -> tuple[np.ndarray, np.ndarray]:
        if sigmas is not None:
            raise ValueError(f"{self.name} takes no given levels")
        t = self.timesteps(steps)
        return (np.append(t, -1).astype(np.float32),
                (t / self.num_train_timesteps).astype(np.float32))

    def tail(self, t_from: float, t_min: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        raise ValueError(f"{self.name} leaps in one step only (leap_steps=1)")

    def solver(self, sigmas: np.ndarray) -> DDIMSolver:
        steps = len(sigmas) - 1
        return DDIMSolver(sigmas[:-1], self.alphas_cumprod,
                          self.num_train_timesteps // steps)

    def jump(self, x: np.ndarray, v: np.ndarray, sigma: float) -> np.ndarray:
        return ddim_x0(x, v, self.alphas_cumprod[int(sigma)])


SCHEDULERS: dict[str, type[Scheduler]] = {
    c.name: c for c in (FlowEuler, FlowUniPC, CogVideoXDDIM, FlowEulerLTX, RFlow)}


def scheduler_for(name: str, shift: float, num_train_timesteps: int,
                  shift_terminal: float | None = None) -> Scheduler:
    """The scheduler a manifest's `sampler.scheduler` names; an unknown name is refused
    naming the known ones."""
    if name not in SCHEDULERS:
        raise ValueError(f"sampler setting scheduler={name!r}: known: {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name](shift, num_train_timesteps, shift_terminal)
