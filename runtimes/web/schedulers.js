// The schedulers of edge/core/schedulers.py as objects, mirrored for the browser (keep the two in
// step): one class per scheduler, looked up by the manifest's `sampler.scheduler`
// (SCHEDULERS, schedulerFor), each with the interface sampler.js asks of it:
//
//   new Cls(shift, numTrainTimesteps, shiftTerminal = null); .name (the manifest's name, also
//     Cls.name); .leapTail (also Cls.leapTail: whether tail() re-plans a leap's rest in
//     several steps; if not, a leap is one jump and checkSettings refuses a leap_steps over
//     1, as Python's Scheduler.leap_tail and SamplerSettings); Cls.takesShiftTerminal
//     (Python's takes_shift_terminal: whether checkSettings lets shift_terminal be set);
//     Cls.takesDynamicGuidance (Python's takes_dynamic_guidance: whether its levels are the
//     training timesteps CogVideoX's dynamic guidance reads, so checkSettings lets
//     dynamic_guidance be set)
//   schedule(steps, given = null) -> { sigmas, modelTimes }: the levels (Float32Array,
//     falling, steps + 1 values; a flow's are its noise levels 1 > ... > 0, cogvideox_ddim's
//     its training timesteps then -1) and what the transformer is told the time of each step
//     is (steps); `given`: `steps` levels in place of the schedule's own spacing, as
//     diffusers' set_timesteps(sigmas=...) takes them (only where Cls.takesSigmas, Python's
//     takes_sigmas)
//   tail(tFrom, tMin, steps) -> { sigmas, modelTimes }: a leap's re-planned rest, `steps`
//     steps from tFrom down to tMin spaced as the schedule spaces its own, then 0 (throws
//     where leapTail is false)
//   solver(sigmas): one generation's stepping, step(v, i, x) -> the sample at sigmas[i + 1]
//   jump(x, v, sigma): a one-step leap to the end, the clean sample the velocity predicts
//     (a flow's x - sigma v)
//
// flow_euler's and ltx_flow_euler's schedules and the leap tail are here; flow_unipc's math
// and its multistep solver (UniPCFlow) are in unipc.js; cogvideox_ddim (CogVideoXDDIM,
// DDIMSolver) is here.
// Float32 ops are rounded one by one with Math.fround as NumPy rounds them, float64 ones are
// plain numbers (tests/fixtures/swift/schedulers.json, tests/test_web_mirrors.py).

import { UniPCFlow, unipcModelTimes, unipcSigmas, wholeStepTimes } from "./unipc.js";

const f32 = Math.fround;

// float32 arrays: shift * s / (1 + (shift - 1) * s), op by op
function shiftSigma32(s, shift) {
  return f32(f32(f32(shift) * s) / f32(1 + f32(f32(shift - 1) * s)));
}

// edge/core/schedulers.py euler_sigmas (FlowMatchEulerDiscreteScheduler.set_timesteps with a static
// shift): a float64 linspace from 1 to the (shifted) smallest training sigma (or the `given`
// levels), rounded to float32, shifted once more in float32, then a final 0 (steps + 1 values).
export function eulerSigmas(steps, shift, numTrainTimesteps, given = null) {
  const x = 1.0 / numTrainTimesteps; // float64 here, as in NumPy
  const sigmaMin = shift * x / (1 + (shift - 1) * x);
  const out = new Float32Array(steps + 1);
  const step = steps > 1 ? (sigmaMin - 1.0) / (steps - 1) : 0;
  for (let i = 0; i < steps; i++) {
    // np.linspace
    const lin = given ? given[i] : steps > 1 && i === steps - 1 ? sigmaMin : i * step + 1.0;
    out[i] = shiftSigma32(f32(lin), shift);
  }
  out[steps] = 0;
  return out;
}

// edge/core/schedulers.py ltx_sigmas (FlowMatchEulerDiscreteScheduler.set_timesteps as LTXPipeline
// calls it): a float64 linspace(1, 1/N, N) (or the `given` levels) rounded to float32, the
// exponential time shift e / (e + (1 / s - 1)) with e = float32(shift) = exp(mu), then (with a
// terminal) 1 - s scaled so the last level is shiftTerminal, all float32 op by op; a final 0.
// A schedule whose last level is 1 (one step) keeps it (the stretch would divide 0 by 0).
export function ltxSigmas(steps, shift, shiftTerminal, given = null) {
  const e = f32(shift);
  const out = new Float32Array(steps + 1);
  const step = steps > 1 ? (1.0 / steps - 1.0) / (steps - 1) : 0;
  for (let i = 0; i < steps; i++) {
    // np.linspace
    const lin = f32(given ? given[i]
      : steps > 1 && i === steps - 1 ? 1.0 / steps : i * step + 1.0);
    out[i] = f32(e / f32(e + f32(f32(1 / lin) - 1)));
  }
  if (shiftTerminal !== null && out[steps - 1] !== 1) {
    // 1 - shiftTerminal in float64, then float32 (diffusers' Python float against float32)
    const scale = f32(f32(1 - out[steps - 1]) / f32(1 - shiftTerminal));
    for (let i = 0; i < steps; i++) out[i] = f32(1 - f32(f32(1 - out[i]) / scale));
  }
  out[steps] = 0;
  return out;
}

// edge/core/schedulers.py leap_tail_sigmas: `steps` steps from tFrom down to tMin, evenly spaced
// before the shift (float64, as NumPy computes on float64), then 0; rounded to float32.
export function leapTailSigmas(tFrom, tMin, steps, shift) {
  const unshift = (t) => t / (shift - (shift - 1) * t);
  const start = unshift(tFrom), stop = unshift(tMin);
  const out = new Float32Array(steps + 1);
  const step = steps > 1 ? (stop - start) / (steps - 1) : 0;
  for (let i = 0; i < steps; i++) {
    const even = steps > 1 && i === steps - 1 ? stop : i * step + start; // np.linspace
    out[i] = shift * even / (1 + (shift - 1) * even);
  }
  out[steps] = 0;
  return out;
}

// One Euler step of a flow: x + (tNext - t) v, float32 op by op (to 0: x - t v)
export function eulerStep(x, v, t, tNext) {
  const d = f32(f32(tNext) - f32(t));
  const out = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = f32(x[i] + f32(d * v[i]));
  return out;
}

// Flow-match Euler through `sigmas`
export class EulerSolver {
  constructor(sigmas) {
    this.sigmas = Float32Array.from(sigmas);
  }

  step(v, i, x) {
    return eulerStep(x, v, this.sigmas[i], this.sigmas[i + 1]);
  }
}

// What the sampler asks of a scheduler (edge/core/schedulers.py Scheduler); a subclass sets
// `static name` to its manifest name and gives schedule, tail and solver; `static leapTail`
// false where it builds no re-planned tail (Python's leap_tail); `static takesShiftTerminal`
// true where its schedule takes a shift_terminal (Python's takes_shift_terminal);
// `static takesDynamicGuidance` true where its levels are whole training timesteps
// (Python's takes_dynamic_guidance); `static takesSigmas` true where given levels can replace
// its spacing (Python's takes_sigmas).
export class Scheduler {
  static leapTail = true;
  static takesShiftTerminal = false;
  static takesDynamicGuidance = false;
  static takesSigmas = false;

  constructor(shift, numTrainTimesteps, shiftTerminal = null) {
    this.shift = shift;
    this.numTrainTimesteps = numTrainTimesteps;
    this.shiftTerminal = shiftTerminal;
  }

  get name() {
    return this.constructor.name;
  }

  get leapTail() {
    return this.constructor.leapTail;
  }

  jump(x, v, sigma) {
    return eulerStep(x, v, sigma, 0);
  }
}

// FlowMatchEulerDiscreteScheduler with a static shift (tiny-sora): the model is told the
// sigmas themselves.
export class FlowEuler extends Scheduler {
  static name = "flow_euler";
  static takesSigmas = true;

  schedule(steps, given = null) {
    const sigmas = eulerSigmas(steps, this.shift, this.numTrainTimesteps, given);
    return { sigmas, modelTimes: sigmas.subarray(0, steps) };
  }

  tail(tFrom, tMin, steps) {
    const sigmas = leapTailSigmas(tFrom, tMin, steps, this.shift);
    return { sigmas, modelTimes: sigmas.subarray(0, steps) };
  }

  solver(sigmas) {
    return new EulerSolver(sigmas);
  }
}

// UniPCMultistepScheduler as Wan 2.1 configures it (unipc.js): model times are whole
// training steps.
export class FlowUniPC extends Scheduler {
  static name = "flow_unipc";
  static takesSigmas = true;

  schedule(steps, given = null) {
    return { sigmas: unipcSigmas(steps, this.shift, this.numTrainTimesteps, given),
             modelTimes: unipcModelTimes(steps, this.shift, this.numTrainTimesteps, given) };
  }

  tail(tFrom, tMin, steps) {
    const sigmas = leapTailSigmas(tFrom, tMin, steps, this.shift);
    return {
      sigmas, modelTimes: wholeStepTimes(sigmas.subarray(0, steps), this.numTrainTimesteps),
    };
  }

  solver(sigmas) {
    return new UniPCFlow(sigmas);
  }
}

// FlowMatchEulerDiscreteScheduler as LTXPipeline sets it (edge/core/schedulers.py FlowEulerLTX,
// ltxSigmas): shift is exp(mu), shiftTerminal the last level before 0 (null: no stretch); the
// model is told the sigmas. Its steps and a leap's tail are flow_euler's with the same shift
// (evenly spaced before it, the terminal stretch not applied again).
export class FlowEulerLTX extends FlowEuler {
  static name = "ltx_flow_euler";
  static takesShiftTerminal = true;

  schedule(steps, given = null) {
    const sigmas = ltxSigmas(steps, this.shift, this.shiftTerminal, given);
    return { sigmas, modelTimes: sigmas.subarray(0, steps) };
  }
}

// Open-Sora 1.2's RFLOW (edge/core/schedulers.py RFlow): flow_euler's static shift (the video
// size's ratio r) on the levels (1 - i/N), np.linspace(1, 1/N, N) in float64.
export class RFlow extends FlowEuler {
  static name = "rflow";

  schedule(steps, given = null) {
    const levels = given ?? Array.from({ length: steps }, (_, i) =>
      steps === 1 ? 1.0 : i === steps - 1 ? 1.0 / steps
        : i * ((1.0 / steps - 1.0) / (steps - 1)) + 1.0);
    const sigmas = eulerSigmas(steps, this.shift, this.numTrainTimesteps, levels);
    return { sigmas, modelTimes: sigmas.subarray(0, steps) };
  }
}

// edge/core/schedulers.py rescale_zero_terminal_snr (float64): the last timestep's signal to zero,
// the first's kept.
export function rescaleZeroTerminalSnr(alphasCumprod) {
  const root = alphasCumprod.map(Math.sqrt);
  const first = root[0], last = root[root.length - 1];
  const scale = first / (first - last);
  return root.map((r) => { const s = (r - last) * scale; return s * s; });
}

// np.arange(start, stop, step) for float64: ceil((stop - start) / step) values, the first
// two start and start + step, the rest start + i * delta with delta = (start + step) - start
// (NumPy's fill)
function arange(start, stop, step) {
  const length = Math.max(0, Math.ceil((stop - start) / step));
  const out = new Float64Array(length);
  if (length > 0) out[0] = start;
  if (length > 1) out[1] = start + step;
  const delta = out[1] - start;
  for (let i = 2; i < length; i++) out[i] = start + i * delta;
  return out;
}

// np.round: to the nearest integer, halves to even
function roundHalfEven(x) {
  const r = Math.round(x); // halves up
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

// edge/core/schedulers.py ddim_x0: the clean sample a v-prediction gives at a level of
// alphas_cumprod `alpha` (float64): sqrt(alpha) x - sqrt(1 - alpha) v, float32 op by op.
export function ddimX0(x, v, alpha) {
  const a = f32(Math.sqrt(alpha)), b = f32(Math.sqrt(1 - alpha));
  const out = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = f32(f32(a * x[i]) - f32(b * v[i]));
  return out;
}

// edge/core/schedulers.py DDIMSolver: diffusers' DDIM step (eta 0) on a v-prediction, from
// timestep t to t - stride (alpha 1 past 0). The scalars are float64; each product float32.
export class DDIMSolver {
  constructor(timesteps, alphasCumprod, stride) {
    this.timesteps = Array.from(timesteps, Math.trunc);
    this.alphasCumprod = alphasCumprod;
    this.stride = stride;
  }

  alpha(t) {
    return t >= 0 ? this.alphasCumprod[t] : 1.0; // set_alpha_to_one
  }

  step(v, i, x) {
    const t = this.timesteps[i];
    const aT = this.alpha(t), aPrev = this.alpha(t - this.stride);
    const x0 = ddimX0(x, v, aT);
    const a = Math.sqrt((1 - aPrev) / (1 - aT));
    const b = Math.sqrt(aPrev) - Math.sqrt(aT) * a;
    const fa = f32(a), fb = f32(b);
    const out = new Float32Array(x.length);
    for (let k = 0; k < x.length; k++) out[k] = f32(f32(fa * x[k]) + f32(fb * x0[k]));
    return out;
  }
}

// CogVideoXDDIMScheduler as CogVideoX ships it (edge/core/schedulers.py CogVideoXDDIM):
// v-prediction, scaled-linear betas, the SNR shift by `shift`, zero terminal SNR, trailing
// timesteps, eta 0, the final alpha 1. Its levels are its training timesteps, then -1; it
// steps from t to t - N // steps. A leap is one jump; no re-planned tail (leapTail false).
export class CogVideoXDDIM extends Scheduler {
  static name = "cogvideox_ddim";
  static leapTail = false;
  static takesDynamicGuidance = true;
  static betaStart = 0.00085;
  static betaEnd = 0.012;

  constructor(shift, numTrainTimesteps, shiftTerminal = null) {
    super(shift, numTrainTimesteps, shiftTerminal);
    const n = numTrainTimesteps;
    // np.linspace(sqrt(beta_start), sqrt(beta_end), n) ** 2, float64
    const start = Math.sqrt(CogVideoXDDIM.betaStart), stop = Math.sqrt(CogVideoXDDIM.betaEnd);
    const step = n > 1 ? (stop - start) / (n - 1) : 0;
    const alphasCumprod = new Float64Array(n);
    let product = 1.0;
    for (let i = 0; i < n; i++) {
      const root = n > 1 && i === n - 1 ? stop : i * step + start; // np.linspace
      product *= 1.0 - root * root;                                  // np.cumprod(1 - betas)
      alphasCumprod[i] = product / (shift + (1 - shift) * product);  // the SNR shift
    }
    this.alphasCumprod = rescaleZeroTerminalSnr(alphasCumprod);
  }

  // diffusers' trailing spacing: round(arange(N, 0, -N / steps)) - 1
  timesteps(steps) {
    const n = this.numTrainTimesteps;
    return Array.from(arange(n, 0, -n / steps), (t) => roundHalfEven(t) - 1);
  }

  schedule(steps) {
    const t = this.timesteps(steps);
    const n = this.numTrainTimesteps;
    return { sigmas: Float32Array.from([...t, -1]),
             modelTimes: Float32Array.from(t, (ti) => ti / n) };
  }

  tail() {
    throw new Error(`${this.name} leaps in one step only (leap_steps=1)`);
  }

  solver(sigmas) {
    const steps = sigmas.length - 1;
    return new DDIMSolver(Array.from(sigmas).slice(0, steps), this.alphasCumprod,
                          Math.floor(this.numTrainTimesteps / steps));
  }

  jump(x, v, sigma) {
    return ddimX0(x, v, this.alphasCumprod[Math.trunc(sigma)]);
  }
}

// edge/core/schedulers.py SCHEDULERS, in its order
export const SCHEDULERS = { flow_euler: FlowEuler, flow_unipc: FlowUniPC,
                            cogvideox_ddim: CogVideoXDDIM, ltx_flow_euler: FlowEulerLTX,
                            rflow: RFlow };

export const isScheduler = (name) => typeof name === "string" && Object.hasOwn(SCHEDULERS, name);

// The refusal of a name not in SCHEDULERS, worded as edge/core/schedulers.py scheduler_for and
// SamplerSettings word it.
export function unknownScheduler(name) {
  return new Error(`sampler setting scheduler=${pythonRepr(name)}: ` +
                   `known: ${Object.keys(SCHEDULERS).join(", ")}`);
}

// The scheduler a manifest's `sampler.scheduler` names
export function schedulerFor(name, shift, numTrainTimesteps, shiftTerminal = null) {
  if (!isScheduler(name)) throw unknownScheduler(name);
  return new SCHEDULERS[name](shift, numTrainTimesteps, shiftTerminal);
}

// A value as Python's repr() writes it: a string in single quotes, or double ones when it
// holds a single quote and no double one (the same rule as pythonRepr in
// runtimes/swift/Sources/EdgeCore/Sampler.swift); anything else as JSON.
export function pythonRepr(value) {
  if (typeof value !== "string") return JSON.stringify(value);
  const quote = value.includes("'") && !value.includes('"') ? '"' : "'";
  const escapes = { "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", [quote]: "\\" + quote };
  return quote + [...value].map((c) => escapes[c] ?? c).join("") + quote;
}
