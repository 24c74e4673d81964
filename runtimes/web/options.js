// The embedding API's option checks (docs/web.md, "Embedding the model in a page"): what
// Pipeline.load and generate refuse, with messages naming the option and the value, all
// before any block runs, so a bad call leaves the pipeline as it was. The sampler settings
// are checked as the Python runtime checks them (edge/core/options.py).
import { checkSettings } from "./sampler.js";

// Python's edge/core/options.py limits: far above any real use, they bound what a typo costs
const MAX_STEPS = 10_000;
const MAX_TRAIN_TIMESTEPS = 1_000_000;
const MAX_GUIDANCE = 1e4;

// JavaScript has one number type, so the kinds edge/core/options.py reads off each setting's
// default (int, float, bool) are written out here
const INTEGER_SETTINGS = [
  "steps", "num_train_timesteps", "leap_min_steps", "leap_patience", "leap_steps", "merge_steps",
];
const REAL_SETTINGS = ["guidance", "guidance_rescale", "shift", "leap_tol", "cache_threshold"];
const BOOLEAN_SETTINGS = ["leap", "dynamic_guidance"];

// generate()'s own options; every other known name is a sampler setting (Python's
// **sampler_overrides). `noise` is the old name of `latents`, kept for existing callers.
export const GENERATE_OPTIONS = ["negative_prompt", "seed", "latents", "noise", "onStep", "signal",
  "decode_timestep", "decode_noise_scale", "decode_noise", "output_type"];
// what generate() hands back (the Python runtime's output_type): the video as bytes, the video
// before rounding (float32 in [0, 1]), or the denoised latents, nothing decoded
export const OUTPUT_TYPES = ["uint8", "float", "latent"];
export const LOAD_OPTIONS = [
  "budget", "path", "onProgress", "signal", "useCache", "tune", "onCacheFailure", "threads",
];
// the most threads onnxruntime-web may be given (its pool is made of web workers)
export const MAX_THREADS = 64;

// load()'s threads: null, or a whole number from 1 to MAX_THREADS
export function checkThreads(threads) {
  if (threads === null) return null;
  if (!Number.isInteger(threads) || threads < 1 || threads > MAX_THREADS) {
    throw new Error(`threads must be a whole number from 1 to ${MAX_THREADS} (or null: ` +
                    `one a core up to 8), got ${show(threads)}`);
  }
  return threads;
}

// A value as a message shows it: NaN and Infinity as such (JSON.stringify says null)
export function show(value) {
  if (typeof value === "number" || typeof value === "bigint") return String(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (value === null || value === undefined) return String(value);
  if (ArrayBuffer.isView(value)) return `a ${value.constructor.name} of ${value.length} values`;
  if (Array.isArray(value)) return `an Array of ${value.length} values`;
  return `a ${typeof value === "object" ? value.constructor?.name || "object" : typeof value}`;
}

export function refuseUnknown(given, known, what) {
  const unknown = Object.keys(given).filter((k) => !known.includes(k)).sort();
  if (unknown.length) {
    throw new Error(`unknown ${what} option(s): ${unknown.join(", ")}; ` +
                    `known: ${[...known].sort().join(", ")}`);
  }
}

// A sampler setting must be of its default's kind (edge/core/options.py _check_value): sampler.js
// checks ranges only, and NaN or "5" would pass them and run to a broken video.
function checkSettingKind(name, value) {
  const bad = (kind) => new Error(`sampler setting ${name}=${show(value)}: must be ${kind}`);
  if (BOOLEAN_SETTINGS.includes(name) && typeof value !== "boolean") throw bad("true or false");
  if (INTEGER_SETTINGS.includes(name) && !Number.isInteger(value)) throw bad("an integer");
  if ((name === "leap_after" || name === "guidance_steps") && value !== null
      && !Number.isInteger(value)) {
    throw bad("an integer or null");
  }
  if (REAL_SETTINGS.includes(name) && !(typeof value === "number" && Number.isFinite(value))) {
    throw bad("a finite number");
  }
  if (name === "sigmas" && value !== null && !Array.isArray(value)) {
    throw bad("a list of numbers or None");
  }
  // null: no terminal stretch (Python's None)
  if (name === "shift_terminal" && value !== null
      && !(typeof value === "number" && Number.isFinite(value))) {
    throw bad("a finite number or null");
  }
}

// The sampler's settings for one call: the package's, overridden; checked as Python's
// with_overrides checks them (kinds, ranges, and the limits of edge/core/options.py)
export function settingsWith(packaged, overrides) {
  for (const [name, value] of Object.entries(overrides)) checkSettingKind(name, value);
  overrides = { ...overrides };
  // given levels say how many steps there are (Python's with_overrides)
  if (overrides.sigmas != null) {
    if (!("steps" in overrides)) overrides.steps = overrides.sigmas.length;
  } else if ("steps" in overrides && !("sigmas" in overrides) && packaged.sigmas != null
             && overrides.steps !== packaged.sigmas.length) {
    throw new Error(`sampler setting steps=${show(overrides.steps)}: these settings ` +
                    `give ${packaged.sigmas.length} noise levels of their own (sigmas); ` +
                    "give sigmas as well, or sigmas=None for the schedule's own spacing");
  }
  const s = checkSettings({ ...packaged, ...overrides });
  const over = (name, most) => new Error(`sampler setting ${name}=${show(s[name])}: ` +
                                         `more than ${most}`);
  if (!(s.shift > 0)) throw new Error(`sampler setting shift=${show(s.shift)}: must be positive`);
  if (s.steps > MAX_STEPS) throw over("steps", MAX_STEPS);
  if (s.leap_steps > MAX_STEPS) throw over("leap_steps", MAX_STEPS);
  if (s.num_train_timesteps > MAX_TRAIN_TIMESTEPS) {
    throw over("num_train_timesteps", MAX_TRAIN_TIMESTEPS);
  }
  if (Math.abs(s.guidance) > MAX_GUIDANCE) {
    throw new Error(`sampler setting guidance=${show(s.guidance)}: larger ` +
                    `than ${MAX_GUIDANCE} in size (far above any useful scale)`);
  }
  if (s.merge_steps > s.steps) {
    throw new Error(`sampler setting merge_steps=${s.merge_steps}: more than ` +
                    `steps=${s.steps} (merging applies to the first merge_steps steps)`);
  }
  return s;
}

// Latents a caller gives: the initial noise in diffusers' layout, (C, T, h, w) flattened
// (batch 1), which is the manifest's latent_shape whatever its latent_layout (that field
// only says how the VAE decoder takes them; Python's runtime reads latents the same way)
export function checkLatents(name, value, shape) {
  const n = shape.reduce((a, b) => a * b, 1);
  const layout = `(${shape.join(", ")}): channels, frames, height, width; diffusers' layout`;
  if (!(value instanceof Float32Array)) {
    throw new Error(`${name} must be a Float32Array of ${n} values ${layout}; got ${show(value)}`);
  }
  if (value.length !== n) {
    throw new Error(`${name} has ${value.length} values; the latents ${layout} have ${n}`);
  }
  if (!value.every(Number.isFinite)) throw new Error(`${name} hold NaN or infinity`);
  return Float32Array.from(value); // a copy: the caller may reuse its array while we run
}

export function checkText(name, value) {
  if (typeof value !== "string") throw new Error(`${name} must be a string, got ${show(value)}`);
  // lone surrogates (a bad decode) would reach the tokenizer as U+FFFD, silently
  if (value.isWellFormed && !value.isWellFormed()) {
    throw new Error(`${name} is not valid Unicode text (a lone surrogate)`);
  }
}

export function checkSignal(name, signal) {
  if (signal !== null && !(signal instanceof AbortSignal)) {
    throw new Error(`${name} must be an AbortSignal ` +
                    `(AbortController's .signal), got ${show(signal)}`);
  }
}

// What fetch() throws when cancelled, so callers test err.name === "AbortError" as for fetch
export function abortError(message, fields = {}) {
  return Object.assign(new DOMException(message, "AbortError"), fields);
}

// Rejects as soon as `signal` aborts, without waiting for `promise` (which stops on its own
// where it can: the loader's downloads take the signal too)
export function abortable(promise, signal, what) {
  if (!signal) return promise;
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(abortError(`${what}: cancelled (the signal was aborted)`));
    if (signal.aborted) return onAbort();
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}
