// The schedulers of edge/schedulers.py as objects, mirrored for the browser (keep the two in
// step): one class per scheduler, looked up by the manifest's `sampler.scheduler`
// (SCHEDULERS, schedulerFor), each with the interface sampler.js asks of it:
//
//   new Cls(shift, numTrainTimesteps); .name (the manifest's name, also Cls.name)
//   schedule(steps) -> { sigmas, modelTimes }: the noise levels (Float32Array, 1 > ... > 0,
//     steps + 1 values) and what the transformer is told the time of each step is (steps)
//   tail(tFrom, tMin, steps) -> { sigmas, modelTimes }: a leap's re-planned rest, `steps`
//     steps from tFrom down to tMin spaced as the schedule spaces its own, then 0
//   solver(sigmas): one generation's stepping, step(v, i, x) -> the sample at sigmas[i + 1]
//   jump(x, v, sigma): a one-step leap to the end, x - sigma v (the x0 the velocity predicts)
//
// flow_euler's schedule and the leap tail are here; flow_unipc's math and its multistep
// solver (UniPCFlow) are in unipc.js. Float32 ops are rounded one by one with Math.fround as
// NumPy rounds them (tests/fixtures/swift/schedulers.json, tests/test_web_mirrors.py).

import { UniPCFlow, unipcModelTimes, unipcSigmas, wholeStepTimes } from "./unipc.js";

const f32 = Math.fround;

// float32 arrays: shift * s / (1 + (shift - 1) * s), op by op
function shiftSigma32(s, shift) {
  return f32(f32(f32(shift) * s) / f32(1 + f32(f32(shift - 1) * s)));
}

// edge/schedulers.py euler_sigmas (FlowMatchEulerDiscreteScheduler.set_timesteps with a static
// shift): a float64 linspace from 1 to the (shifted) smallest training sigma, rounded to
// float32, shifted once more in float32, then a final 0 (steps + 1 values).
export function eulerSigmas(steps, shift, numTrainTimesteps) {
  const x = 1.0 / numTrainTimesteps; // float64 here, as in NumPy
  const sigmaMin = shift * x / (1 + (shift - 1) * x);
  const out = new Float32Array(steps + 1);
  const step = steps > 1 ? (sigmaMin - 1.0) / (steps - 1) : 0;
  for (let i = 0; i < steps; i++) {
    const lin = steps > 1 && i === steps - 1 ? sigmaMin : i * step + 1.0; // np.linspace
    out[i] = shiftSigma32(f32(lin), shift);
  }
  out[steps] = 0;
  return out;
}

// edge/schedulers.py leap_tail_sigmas: `steps` steps from tFrom down to tMin, evenly spaced
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

// What the sampler asks of a scheduler (edge/schedulers.py Scheduler); a subclass sets
// `static name` to its manifest name and gives schedule, tail and solver.
export class Scheduler {
  constructor(shift, numTrainTimesteps) {
    this.shift = shift;
    this.numTrainTimesteps = numTrainTimesteps;
  }

  get name() {
    return this.constructor.name;
  }

  jump(x, v, sigma) {
    return eulerStep(x, v, sigma, 0);
  }
}

// FlowMatchEulerDiscreteScheduler with a static shift (tiny-sora, LTX-Video): the model is
// told the sigmas themselves.
export class FlowEuler extends Scheduler {
  static name = "flow_euler";

  schedule(steps) {
    const sigmas = eulerSigmas(steps, this.shift, this.numTrainTimesteps);
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

  schedule(steps) {
    return { sigmas: unipcSigmas(steps, this.shift, this.numTrainTimesteps),
             modelTimes: unipcModelTimes(steps, this.shift, this.numTrainTimesteps) };
  }

  tail(tFrom, tMin, steps) {
    const sigmas = leapTailSigmas(tFrom, tMin, steps, this.shift);
    return { sigmas, modelTimes: wholeStepTimes(sigmas.subarray(0, steps), this.numTrainTimesteps) };
  }

  solver(sigmas) {
    return new UniPCFlow(sigmas);
  }
}

// edge/schedulers.py SCHEDULERS, in its order
export const SCHEDULERS = { flow_euler: FlowEuler, flow_unipc: FlowUniPC };

export const isScheduler = (name) => typeof name === "string" && Object.hasOwn(SCHEDULERS, name);

// The refusal of a name not in SCHEDULERS, worded as edge/schedulers.py scheduler_for and
// SamplerSettings word it.
export function unknownScheduler(name) {
  return new Error(`sampler setting scheduler=${pythonRepr(name)}: known: ${Object.keys(SCHEDULERS).join(", ")}`);
}

// The scheduler a manifest's `sampler.scheduler` names
export function schedulerFor(name, shift, numTrainTimesteps) {
  if (!isScheduler(name)) throw unknownScheduler(name);
  return new SCHEDULERS[name](shift, numTrainTimesteps);
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
