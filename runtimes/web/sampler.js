// The sampler loop of edge/core/sampler.py, mirrored line by line (keep the two in step).
// The scheduler is an object (schedulers.js, as edge/core/schedulers.py), looked up by the
// settings' `scheduler` name: sample() asks it for the schedule, a solver to step through
// it, a leap's re-planned tail and the one-step jump, and tests no scheduler name itself.
//
// Arrays are Float32Array (the latents) and plain numbers (float64). NumPy computes float32
// arrays op by op in float32, so every such op here is rounded with Math.fround; reductions
// it does in float64 (cosines, the step cache's L1 and LayerNorm) are in float64 here too.
// tests/fixtures/sampler/*.json (tests/test_web_browser.py) and tests/fixtures/swift/unipc.json,
// schedulers.json, dynamic_guidance.json and guidance_rescale.json (tests/test_web_mirrors.py)
// replay recorded sequences through both.

import { SCHEDULERS, isScheduler, schedulerFor, unknownScheduler } from "./schedulers.js";

const f32 = Math.fround;

export const DEFAULT_SETTINGS = {
  steps: 30, guidance: 5.0, dynamic_guidance: false, guidance_rescale: 0.0, shift: 3.0,
  num_train_timesteps: 1000, scheduler: "flow_euler",
  shift_terminal: null,
  leap: false, leap_after: null, leap_min_steps: 15, leap_patience: 3, leap_tol: 1e-3,
  leap_steps: 1, merge_steps: 0, cache_threshold: 0.0, guidance_steps: null, sigmas: null,
};

// edge/core/sampler.py SamplerSettings._check_sigmas: given levels, one a step, falling in (0, 1],
// for a scheduler that takes them
function checkSigmas(s, bad) {
  const levels = s.sigmas;
  if (!SCHEDULERS[s.scheduler].takesSigmas) {
    const takers = Object.keys(SCHEDULERS).filter((n) => SCHEDULERS[n].takesSigmas).join(", ");
    throw bad("sigmas", `${s.scheduler} takes no given levels (its diffusers ` +
                        `scheduler takes none either; ${takers} do)`);
  }
  if (!Array.isArray(levels) || !levels.every((v) => typeof v === "number" && Number.isFinite(v))) {
    throw bad("sigmas", "must be a list of finite numbers, or None for the schedule's own levels");
  }
  if (levels.length !== s.steps) {
    throw bad("sigmas", `${levels.length} levels for steps=${s.steps} (one level a step)`);
  }
  const outside = levels.find((v) => !(v > 0 && v <= 1));
  if (outside !== undefined) {
    throw bad("sigmas", `${outside} is outside the schedule's range (0, 1]`);
  }
  const rise = levels.findIndex((v, i) => i > 0 && v >= levels[i - 1]);
  if (rise > 0) {
    throw bad("sigmas", `does not fall: level ${rise} (${levels[rise]}) is ` +
                        `not below level ${rise - 1} (${levels[rise - 1]})`);
  }
}

// edge/core/options.py's bounds: far above any useful value, so a typo is not a plan
const MAX_STEPS = 10000;
const MAX_TRAIN_TIMESTEPS = 1000000;
const MAX_GUIDANCE = 1e4;

export function checkSettings(values) {
  // own keys only: `toString` or `constructor` is no setting (`in` sees inherited ones)
  const unknown = Object.keys(values).filter((k) => !Object.hasOwn(DEFAULT_SETTINGS, k));
  if (unknown.length) throw new Error(`unknown sampler setting(s): ${unknown.sort().join(", ")}`);
  const s = { ...DEFAULT_SETTINGS, ...values };
  const bad = (name, why) => new Error(
    `sampler setting ${name}=${JSON.stringify(s[name])}: ${why}`);
  // edge/core/schedulers.py SCHEDULERS, with SamplerSettings' own message (the value as repr())
  if (!isScheduler(s.scheduler)) throw unknownScheduler(s.scheduler);
  if (!Number.isInteger(s.steps) || s.steps < 1) throw bad("steps", "must be at least 1");
  for (const [name, most] of [["steps", MAX_STEPS], ["leap_steps", MAX_STEPS],
                              ["num_train_timesteps", MAX_TRAIN_TIMESTEPS]]) {
    if (s[name] > most) throw bad(name, `more than ${most}`);
  }
  if (!Number.isInteger(s.num_train_timesteps) || s.num_train_timesteps < 1) {
    throw bad("num_train_timesteps", "must be an integer");
  }
  if (!(typeof s.shift === "number" && Number.isFinite(s.shift))) {
    throw bad("shift", "must be a finite number");
  }
  if (s.shift <= 0) throw bad("shift", "must be positive");
  if (s.dynamic_guidance && !SCHEDULERS[s.scheduler].takesDynamicGuidance) {
    const takers = Object.keys(SCHEDULERS).filter((n) => SCHEDULERS[n].takesDynamicGuidance)
      .join(", ");
    // the value as Python's repr() writes it, for SamplerSettings' own message
    throw new Error(`sampler setting dynamic_guidance=True: ${s.scheduler} ` +
                    `steps through no training timesteps (only ${takers} ` +
                    "does; CogVideoX's dynamic guidance is a function of them)");
  }
  const r = s.guidance_rescale;
  if (!(typeof r === "number" && r >= 0 && r <= 1)) {
    throw bad("guidance_rescale", "must be a number from 0 (off) to 1 " +
                                  "(the guided velocity wholly rescaled)");
  }
  if (s.shift_terminal !== null) {
    const t = s.shift_terminal;
    if (!(typeof t === "number" && t > 0 && t < 1)) {
      throw bad("shift_terminal", "must be a number between 0 and 1 (the last " +
                                  "noise level before 0), or None for no stretch");
    }
    if (!SCHEDULERS[s.scheduler].takesShiftTerminal) {
      const takers = Object.keys(SCHEDULERS).filter((n) => SCHEDULERS[n].takesShiftTerminal)
        .join(", ");
      throw bad("shift_terminal", `${s.scheduler} takes none (only ${takers} ` +
                                  "stretches its schedule to a terminal level)");
    }
  }
  // a leap after steps - 1 or more steps never happens, so a package's fixed leap stays valid
  if (s.leap_after !== null && !(Number.isInteger(s.leap_after) && s.leap_after >= 1)) {
    throw bad("leap_after", "must be at least 1");
  }
  if (s.leap_min_steps < 1) throw bad("leap_min_steps", "must be at least 1");
  if (s.leap_patience < 1) throw bad("leap_patience", "must be at least 1");
  if (!(s.leap_tol >= 0)) throw bad("leap_tol", "must not be negative");
  if (!Number.isInteger(s.leap_steps) || s.leap_steps < 1) {
    throw bad("leap_steps", "must be at least 1");
  }
  if (s.leap_steps > 1 && !SCHEDULERS[s.scheduler].leapTail) {
    throw bad("leap_steps", `${s.scheduler} leaps in one step only ` +
                            "(no re-planned tail is built for it)");
  }
  if (!Number.isInteger(s.merge_steps) || s.merge_steps < 0) {
    throw bad("merge_steps", "must not be negative");
  }
  if (!(s.cache_threshold >= 0)) throw bad("cache_threshold", "must not be negative");
  const k = s.guidance_steps;
  if (k !== null && !(Number.isInteger(k) && k >= 0 && k <= s.steps)) {
    throw bad("guidance_steps", "must be a whole number from 0 to steps " +
                                `(${s.steps}), or None to guide every call`);
  }
  if (s.sigmas !== null) checkSigmas(s, bad);
  if (!Number.isFinite(s.guidance)) throw bad("guidance", "must be a finite number");
  if (Math.abs(s.guidance) > MAX_GUIDANCE) {
    throw bad("guidance", `larger than ${MAX_GUIDANCE} in size (far above any useful scale)`);
  }
  checkSchedule(s);
  return s;
}

// edge/core/options.py check_settings: the schedule the settings make falls from 1 to 0,
// finite and distinct (a shift of 1e-300 or one training timestep makes none: NaN videos)
function checkSchedule(s) {
  let falls = false;  // a schedule the arithmetic cannot make (it throws) is none either
  try {
    const levels = timesteps(s);
    falls = levels.every((v, i) => Number.isFinite(v) && (i === 0 || v < levels[i - 1]));
  } catch { /* falls stays false */ }
  if (falls) return;
  if (s.sigmas !== null) {
    throw new Error(`sampler setting sigmas=${JSON.stringify(s.sigmas)}: no usable noise ` +
                    "schedule (the levels, shifted, must fall, finite and distinct)");
  }
  const terminal = s.shift_terminal === null ? "" : `, shift_terminal=${s.shift_terminal}`;
  throw new Error(`sampler settings shift=${s.shift}, num_train_timesteps=` +
                  `${s.num_train_timesteps}${terminal}: no usable noise schedule (its levels ` +
                  "must fall from 1 to 0, finite and distinct)");
}

// edge/core/sampler.py scheduler_of: the settings' scheduler object (schedulers.js)
export function schedulerOf(settings) {
  return schedulerFor(settings.scheduler, settings.shift, settings.num_train_timesteps,
                      settings.shift_terminal);
}

// The noise levels t_0 = 1 > ... > t_N = 0 (Float32Array, steps + 1 values), as the settings'
// diffusers scheduler sets them.
export function timesteps(settings) {
  return schedulerOf(settings).schedule(settings.steps, settings.sigmas).sigmas;
}

// What the transformer is told the time of each step is (steps values): the sigmas for
// flow-match Euler; UniPC's whole training timesteps as fractions.
export function modelTimes(settings) {
  return schedulerOf(settings).schedule(settings.steps, settings.sigmas).modelTimes;
}

export function guidedVelocity(vCond, vUncond, guidance) {
  const g = f32(guidance);
  const out = new Float32Array(vCond.length);
  for (let i = 0; i < out.length; i++) {
    out[i] = f32(vUncond[i] + f32(g * f32(vCond[i] - vUncond[i])));
  }
  return out;
}

// The standard deviation of all values with Bessel's correction (torch.std's), in float64.
function besselStd(a) {
  let mean = 0;
  for (let i = 0; i < a.length; i++) mean += a[i];
  mean /= a.length;
  let squares = 0;
  for (let i = 0; i < a.length; i++) { const d = a[i] - mean; squares += d * d; }
  return Math.sqrt(squares / (a.length - 1));
}

// edge/core/sampler.py rescaled_guidance (LTXPipeline's guidance_rescale) for one sample (the
// page generates one video at a time): v scaled to vCond's standard deviation, mixed with v
// by `rescale`, in float64 then float32. Sums run in order where NumPy's are pairwise: the
// same to float32 rounding, not bit for bit.
export function rescaledGuidance(v, vCond, rescale) {
  const ratio = besselStd(vCond) / besselStd(v);
  const out = new Float32Array(v.length);
  for (let i = 0; i < out.length; i++) {
    out[i] = f32(rescale * (v[i] * ratio) + (1 - rescale) * v[i]);
  }
  return out;
}

// a * b exactly, as the pair p + e (Dekker's product: each factor split into halves of 26
// bits, whose products are exact)
function twoProduct(a, b) {
  const split = (v) => { const c = 134217729 * v; const hi = c - (c - v); return [hi, v - hi]; };
  const p = a * b;
  const [ah, al] = split(a), [bh, bl] = split(b);
  return [p, ((ah * bh - p) + ah * bl + al * bh) + al * bl];
}

// x ** 5 correctly rounded, which is Python's `x ** 5.0` (glibc's pow) on every pair the
// fixtures hold: Math.pow is off in the last bit for some bases (how many depends on the V8
// version: about one in twelve in Node 20), and dynamicGuidance's cosine of a huge power
// hangs on its last bits. x^2 exactly, x^4 and x^5 with their small parts carried (~2^-100
// relative), then one rounding. Odd in x, as Python's ** is for a negative base.
export function fifthPower(x) {
  const [s, se] = twoProduct(x, x);
  const [q, qe] = twoProduct(s, s);
  const fourthError = qe + (2 * s * se + se * se);
  const [r, re] = twoProduct(q, x);
  return r + (re + fourthError * x);
}

// edge/core/sampler.py dynamic_guidance: CogVideoXPipeline's use_dynamic_cfg scale at training
// timestep `timestep` of a `steps`-step run, in float64 as diffusers computes it
export function dynamicGuidance(guidance, timestep, steps) {
  return 1 + guidance * ((1 - Math.cos(Math.PI * fifthPower((steps - timestep) / steps))) / 2);
}

// edge/core/sampler.py step_guidance: `guidance`, or CogVideoX's scale at the step's level (a
// training timestep) with dynamic_guidance and a guidance over 1 (diffusers runs no guidance
// at or below 1)
// edge/core/sampler.py guided_call: whether call `call` (0-based) is guided: a scale over 1 (as
// diffusers' do_classifier_free_guidance) and the call before the cutoff (guidance_steps)
export function guidedCall(settings, call) {
  return settings.guidance > 1
    && (settings.guidance_steps === null || call < settings.guidance_steps);
}

export function stepGuidance(settings, level, steps) {
  if (settings.dynamic_guidance && settings.guidance > 1) {
    return dynamicGuidance(settings.guidance, Math.trunc(level), steps);
  }
  return settings.guidance;
}

export function cosine(a, b) {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  const denom = Math.sqrt(na) * Math.sqrt(nb);
  return denom > 0 ? dot / denom : 1.0;
}

export class LeapRule {
  constructor(settings) {
    this.settings = settings;
    this.previous = null;
    this.best = -Infinity;
    this.stale = 0;
    this.cosines = [];
  }

  shouldLeap(v, stepsDone) {
    const s = this.settings;
    if (this.previous !== null) {
      const c = cosine(v, this.previous);
      this.cosines.push(c);
      if (c > this.best + s.leap_tol) { this.best = c; this.stale = 0; } else { this.stale += 1; }
    }
    this.previous = v;
    if (!s.leap || stepsDone >= s.steps - 1) return false;
    if (s.leap_after !== null) return stepsDone >= s.leap_after;
    return stepsDone >= s.leap_min_steps && this.stale >= s.leap_patience;
  }
}

// x: (B, T, S, D) tokens, tMod: (B, 6, D); returns float64 values (Float64Array)
export function modulatedInput(x, tMod, batch, dim, eps = 1e-6) {
  const rows = x.length / dim;
  const perSample = rows / batch;
  const out = new Float64Array(x.length);
  for (let r = 0; r < rows; r++) {
    const b = Math.floor(r / perSample);
    let mean = 0;
    for (let d = 0; d < dim; d++) mean += x[r * dim + d];
    mean /= dim;
    let v = 0;
    for (let d = 0; d < dim; d++) { const e = x[r * dim + d] - mean; v += e * e; }
    const inv = Math.sqrt(v / dim + eps);
    for (let d = 0; d < dim; d++) {
      const h = (x[r * dim + d] - mean) / inv;
      out[r * dim + d] = h * (1.0 + tMod[(b * 6 + 1) * dim + d]) + tMod[(b * 6) * dim + d];
    }
  }
  return out;
}

export function relativeL1(a, b) {
  let num = 0, den = 0;
  for (let i = 0; i < a.length; i++) { num += Math.abs(a[i] - b[i]); den += Math.abs(b[i]); }
  num /= a.length; den /= a.length;
  return den > 0 ? num / den : Infinity;
}

export class StepCache {
  constructor(threshold) {
    this.threshold = threshold;
    this.previous = null;
    this.accumulated = 0.0;
    this.residual = null;
  }

  shouldCompute(indicator, force = false) {
    const change = this.previous === null ? Infinity : relativeL1(indicator, this.previous);
    this.previous = indicator;
    if (force || this.residual === null) {
      this.accumulated = 0.0;
      return true;
    }
    this.accumulated += change;
    if (this.accumulated < this.threshold) return false;
    this.accumulated = 0.0;
    return true;
  }

  store(before, after) {
    this.residual = new Float32Array(after.length);
    for (let i = 0; i < after.length; i++) this.residual[i] = f32(after[i] - before[i]);
  }

  reuse(before) {
    const out = new Float32Array(before.length);
    for (let i = 0; i < before.length; i++) out[i] = f32(before[i] + this.residual[i]);
    return out;
  }
}

// runPairs(step, x, tMod, pairs, batch, dim) -> [tokens after the pairs, whether they ran]
export async function runPairs(step, x, tMod, pairs, batch, dim) {
  if (step.cache === null) return [await pairs(x), true];
  // the indicator of the caption half: the first step.videos rows of the batch
  const rows = Math.min(step.videos ?? batch, batch);
  const indicator = modulatedInput(x.subarray(0, (x.length / batch) * rows),
                                   tMod.subarray(0, (tMod.length / batch) * rows), rows, dim);
  // a residual of fewer rows than the call's batch cannot stand in (edge/core/sampler.py)
  const short = step.cache.residual !== null && step.cache.residual.length < x.length;
  if (step.cache.shouldCompute(indicator, step.index === 0 || step.last || short)) {
    const out = await pairs(x);
    step.cache.store(x, out);
    return [out, true];
  }
  step.computed = false;
  return [step.cache.reuse(x), false];
}

// predict(x, t, step) -> Promise<[vCond, vUncond]>, t the model time of the step
// (modelTimes); returns the final latents. After a leap the loop goes on over the leap's tail
// (its own noise levels and model times, a fresh solver) until t = 0.
export async function sample(predict, noise, settings, onStep = null, trace = {}) {
  const scheduler = schedulerOf(settings);
  let { sigmas: ts, modelTimes: modelTs } = scheduler.schedule(settings.steps, settings.sigmas);
  let solver = scheduler.solver(ts);
  let x = Float32Array.from(noise);
  Object.assign(trace, {
    calls: 0, transformer_calls: 0, leap_at: null, cosines: [], merged_calls: 0, guided_calls: 0,
  });
  const rule = new LeapRule(settings);
  const cache = settings.cache_threshold > 0 ? new StepCache(settings.cache_threshold) : null;
  // a fixed leap is known in advance, so the cache can treat its tail's end as the last call
  const fixedLeap = settings.leap && settings.leap_after !== null
    && settings.leap_after < settings.steps - 1;
  let lastCall = fixedLeap ? settings.leap_after + settings.leap_steps - 1 : settings.steps - 1;
  let total = settings.steps; // calls this generation makes, as far as known now
  let call = 0, i = 0;        // call: transformer calls so far; i: index into ts
  while (i < ts.length - 1) {
    const step = {
      index: call, merged: call < settings.merge_steps, cache, last: call === lastCall,
      computed: true, guided: guidedCall(settings, call), videos: 1, // the page makes one video
    };
    const [vCond, vUncond] = await predict(x, modelTs[i], step); // vUncond null if unguided
    trace.calls += 1;
    trace.transformer_calls += step.computed ? 1 : 0;
    trace.merged_calls += step.merged ? 1 : 0;
    trace.guided_calls += step.guided ? 1 : 0;
    let v = vCond;
    if (step.guided) {
      // the step count of the schedule being run: `steps` with dynamic guidance, whose
      // scheduler never re-plans a tail; a leap's jump is guided as the step it replaces
      v = guidedVelocity(vCond, vUncond, stepGuidance(settings, ts[i], ts.length - 1));
      if (settings.guidance_rescale > 0) v = rescaledGuidance(v, vCond, settings.guidance_rescale);
    }
    if (trace.leap_at === null && rule.shouldLeap(v, call)) {
      trace.leap_at = call;
      if (settings.leap_steps === 1) { // the whole remaining time in one step
        x = scheduler.jump(x, v, ts[i]);
        call += 1;
        total = call;
        if (onStep) onStep(total, total);
        break;
      }
      ({ sigmas: ts, modelTimes: modelTs } = scheduler.tail(
        ts[i], ts[ts.length - 2], settings.leap_steps));
      solver = scheduler.solver(ts);
      i = 0;
      lastCall = call + settings.leap_steps - 1;
      total = call + settings.leap_steps;
    }
    x = solver.step(v, i, x);
    i += 1;
    call += 1;
    if (onStep) onStep(call, total);
  }
  trace.cosines = rule.cosines;
  return x;
}
