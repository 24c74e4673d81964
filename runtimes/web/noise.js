// What a seed means (edge/core/noise.py): the initial latents for `seed` are PyTorch's
// torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=float32), which
// is what diffusers draws for that generator; so a seed gives the same video here as in the
// Python runtime and in diffusers.
//
// - engine: the 32-bit Mersenne Twister seeded as std::mt19937 with the seed's low 32 bits
//   (PyTorch's manual_seed);
// - 16 values or more (PyTorch's normal_fill): one float32 uniform per value, (word & 0xFFFFFF)
//   * 2^-24; each group of 16 becomes 8 Box-Muller pairs (u1 = 1 - data[j], u2 = data[j + 8];
//   data[j] = r cos, data[j + 8] = r sin), in float32; when the count is not a multiple of 16
//   the last 16 values are drawn again from 16 fresh words;
// - fewer than 16 values: float64 normals, each pair from two 53-bit uniforms of two words
//   each (high word first), radius sqrt(-2 log1p(-u2)), theta 2 pi u1, cosine first.
//
// PyTorch computes the large path's log, sin and cos with SIMD float32 approximations (Sleef);
// ours are our own, so values agree with torch's to one float32 ulp, not bit for bit: within
// 2.4e-7 on the fixtures tests/test_web_browser.py replays (written by torch itself), 4.8e-7
// (one ulp at |value| >= 4) over whole draws.
//
// Two ways to those values for 16 or more, chosen once per page (each within an ulp of torch's,
// so a value can differ between them as it can from torch):
// - WebAssembly SIMD (noise.wat, assembled into noise_wasm.js by tools/noise_wasm.py): the
//   twist, tempering and Box-Muller four lanes at a time, in float32 step by step as torch
//   computes them (1 value in 7 differs from torch's by an ulp); wherever
//   WebAssembly.validate accepts the module, which needs SIMD (chromium 91, Firefox 89,
//   Safari 16.4);
// - else the scalar JavaScript below: float64 through tables and series, rounded once (1 value
//   in 2.6 differs from torch's by an ulp), taking ~1.7x the time.
// Why WebAssembly: Wan's 2.1 M values took ~12 ms in the JavaScript against ~5 ms for
// torch.randn; the kernel's share is now ~3.5 ms, and ~3 ms more is the browser allocating,
// first touching and filling the 8 MB result, which no kernel avoids (docs/benchmarks.md).

import { NOISE_WASM } from "./noise_wasm.js";

export const NOISE = "torch.randn/cpu/float32"; // the manifest's `noise` field this draws
export const LEGACY_NOISE = "numpy.pcg64";      // what a package without the field meant
export const MAX_SEED = (1n << 63n) - 1n;      // manual_seed takes a signed 64-bit seed

const RANGE = "a whole number from 0 to 2^63 - 1";

// The seed as a BigInt, or an Error naming it: a whole number from 0 to 2^63 - 1, given as a
// Number (exact integers only: up to 2^53 - 1), a BigInt, or a string of decimal digits.
export function checkSeed(seed) {
  let value;
  if (typeof seed === "bigint") {
    value = seed;
  } else if (typeof seed === "number") {
    if (!Number.isInteger(seed)) throw new Error(`seed ${seed} must be ${RANGE}`);
    if (seed < 0) throw new Error(`seed ${seed} is out of range: a seed is ${RANGE}`);
    // past 2^53 - 1 a Number may already be another integer than the one written
    if (!Number.isSafeInteger(seed)) {
      throw new Error(`seed ${seed} is past 2^53 - 1 (Number.MAX_SAFE_INTEGER), ` +
                      "where a JavaScript Number no longer holds every integer: " +
                      "pass the seed as a BigInt or a string of its decimal " +
                      `digits (e.g. 9223372036854775807n or "9223372036854775807")`);
    }
    value = BigInt(seed);
  } else if (typeof seed === "string") {
    if (!/^-?[0-9]+$/.test(seed)) {
      throw new Error(`seed ${JSON.stringify(seed)} must be ${RANGE}, in decimal digits`);
    }
    value = BigInt(seed);
  } else {
    throw new Error(`seed ${String(seed)} (${typeof seed}) must ` +
                    `be ${RANGE}: a Number, a BigInt or a decimal string`);
  }
  if (value < 0n || value > MAX_SEED) {
    throw new Error(`seed ${value} is out of range: a seed is ${RANGE}`);
  }
  return value;
}

// Refuse to draw a seed for a package whose seeds were defined otherwise (written before the
// `noise` field, they meant NumPy PCG64 noise): the same seed would give another video than
// the one the package's author saw. Given noise needs no definition.
export function checkNoise(manifest, where = "manifest.json") {
  const noise = manifest.noise ?? LEGACY_NOISE;
  if (noise !== NOISE) {
    throw new Error(`${where}: noise ${JSON.stringify(noise)}: this runtime draws a seed ` +
                    `as ${JSON.stringify(NOISE)}, so the seed would give another video ` +
                    "than the package's; re-export the package or pass the initial noise");
  }
}

// std::mt19937. The state is an Int32Array and every step stays in int32 (xors, shifts,
// masks), so the JIT keeps it in integer registers; constants are written out as int32
// literals (module-level consts would be reloaded and hole-checked in the hot loops).
const N = 624;

function seedState(seed32) {
  const mt = new Int32Array(N);
  mt[0] = seed32;
  for (let i = 1; i < N; i++) {
    const p = mt[i - 1];
    mt[i] = (Math.imul(1812433253, p ^ (p >>> 30)) + i) | 0;
  }
  return mt;
}

// the next 624 words, in place (untempered); the old mt[kk + 1] is carried to the next round
function twist(mt) {
  let cur = mt[0];
  for (let kk = 0; kk < 227; kk++) {
    const next = mt[kk + 1];
    const y = (cur & -0x80000000) | (next & 0x7fffffff);
    mt[kk] = mt[kk + 397] ^ (y >>> 1) ^ (-(y & 1) & -0x66f74f21); // 0x9908b0df
    cur = next;
  }
  for (let kk = 227; kk < 623; kk++) {
    const next = mt[kk + 1];
    const y = (cur & -0x80000000) | (next & 0x7fffffff);
    mt[kk] = mt[kk - 227] ^ (y >>> 1) ^ (-(y & 1) & -0x66f74f21);
    cur = next;
  }
  const y = (cur & -0x80000000) | (mt[0] & 0x7fffffff);
  mt[623] = mt[396] ^ (y >>> 1) ^ (-(y & 1) & -0x66f74f21);
}

function temper(y) {
  y ^= y >>> 11;
  y ^= (y << 7) & -0x62d3a980;   // 0x9d2c5680
  y ^= (y << 15) & -0x103a0000;  // 0xefc60000
  return y ^ (y >>> 18);
}

// A reader of the engine's words: the bulk path twists and reads mt itself, and leaves
// `index` where it stopped.
class Engine {
  constructor(seed32) {
    this.mt = seedState(seed32);
    this.index = N; // the first word twists
  }

  raw() { // the next untempered word
    if (this.index >= N) {
      twist(this.mt);
      this.index = 0;
    }
    return this.mt[this.index++];
  }

  next() { // the next word, as uint32
    return temper(this.raw()) >>> 0;
  }
}

// -2 log u1 without Math.log (a C call, ~4x slower here): u1 = k 2^-24 with k = 2^24 - (word &
// 0xFFFFFF) in [1, 2^24]. k = 2^e x, x in [1, 2), x = c_j (1 + r) where c_j = 1 + j/256 from
// the 8 bits after the leading one, so log k = e ln 2 + log c_j + log1p(r) with r in
// [0, 1/256): four terms of log1p's series. Within 4e-13 of -2 Math.log(u1) for every k, and
// exactly 0 at u1 = 1. LOG_T: [log c_j, 2^-31 / c_j] per j.
const LOG_T = new Float64Array(512);
for (let j = 0; j < 256; j++) {
  LOG_T[2 * j] = Math.log1p(j / 256);
  LOG_T[2 * j + 1] = 2 ** -31 / (1 + j / 256);
}
// cos and sin of theta = float32(2pi_f32 * u2), as PyTorch's float32 theta, without Math.cos
// and Math.sin: theta = A + x with A = 2pi_f32 hi / 4096 from a table (hi: the top 12 bits of
// the 24) and x in [-3e-7, 1.6e-3), where two terms of each series are exact to 1e-16.
// COS_SIN: [cos A, sin A] per hi. 2pi_f32 2^-24 and 2pi_f32 2^-12 are exact in a double.
const STEP_24 = Math.fround(2 * Math.PI) * 2 ** -24;
const COS_SIN = new Float64Array(8192);
for (let i = 0; i < 4096; i++) {
  COS_SIN[2 * i] = Math.cos(STEP_24 * 4096 * i);
  COS_SIN[2 * i + 1] = Math.sin(STEP_24 * 4096 * i);
}

// PyTorch's normal_fill_16 on each group of 16 untempered words w[g..g+16), g < end, into
// out[o + g..]: tempering, uniforms, log and the angle inline in one loop, no allocation.
// (The literals: 2 ln 2, 2pi_f32 2^-24, 2pi_f32 2^-12.)
function fillGroups(w, end, out, o, logT, cosSin) {
  for (let g = 0; g < end; g += 16) {
    for (let j = g; j < g + 8; j++) {
      let a = w[j];
      a ^= a >>> 11; a ^= (a << 7) & -0x62d3a980; a ^= (a << 15) & -0x103a0000; a ^= a >>> 18;
      let b = w[j + 8];
      b ^= b >>> 11; b ^= (b << 7) & -0x62d3a980; b ^= (b << 15) & -0x103a0000; b ^= b >>> 18;
      // radius = sqrt(-2 log u1), u1 = 1 - u = k 2^-24 (exact, as in float32)
      const k = 0x1000000 - (a & 0xffffff);
      const lead = Math.clz32(k);
      const frac = (k << lead) & 0x7fffffff; // the bits after the leading one
      const t = (frac >>> 23) << 1;
      const r = (frac & 0x7fffff) * logT[t + 1];
      const radius = Math.sqrt((lead - 7) * 1.3862943611198906
        - 2 * (logT[t] + r * (1 + r * (-0.5 + r * (0.3333333333333333 + r * -0.25)))));
      // theta = float32(2pi_f32 u2), u2 = m 2^-24
      const m = b & 0xffffff;
      const hi = m >>> 12;
      const ca = cosSin[hi << 1], sa = cosSin[(hi << 1) + 1];
      const x = Math.fround(m * 3.7450703871400037e-7) - hi * 0.0015339808305725455;
      const x2 = x * x;
      const cx = 1 - x2 * (0.5 - x2 * 0.041666666666666664);
      const sx = x - x * x2 * 0.16666666666666666;
      out[o + j] = radius * (ca * cx - sa * sx);      // the store rounds to float32
      out[o + j + 8] = radius * (sa * cx + ca * sx);
    }
  }
}

// PyTorch's path under 16 values: at::normal_distribution<double>, one pair of values per two
// 53-bit uniforms (the sine half is what the generator caches for the next value).
function fewNormals(engine, count) {
  const out = new Float32Array(count);
  const uniform53 = () => {
    const hi = engine.next();
    const lo = engine.next();
    return ((hi & 0x1fffff) * 4294967296 + lo) * 2 ** -53;
  };
  for (let i = 0; i < count; i += 2) {
    const u1 = uniform53();
    const u2 = uniform53();
    const radius = Math.sqrt(-2 * Math.log1p(-u2));
    const theta = 2 * Math.PI * u1;
    out[i] = radius * Math.cos(theta);
    if (i + 1 < count) out[i + 1] = radius * Math.sin(theta);
  }
  return out;
}

// The SIMD kernel, compiled on first use: { fill, state, values } over its memory, or null
// where WebAssembly or its SIMD is missing (validate refuses the module) or compiling fails.
// Compiled synchronously, so torchRandn stays synchronous: chromium allows that on the main
// thread for modules under 4 KB (this one is 1.4 KB; a test keeps it under).
const WASM_OUT = 4096;              // noise.wat: where `fill` writes its values
const CHUNK_GROUPS = 39 * 16;       // groups per `fill` call: 16 twists, 9984 values, 39 KB at
                                    // WASM_OUT (a multiple of 39: each call starts at a twist)
let kernel;

function simdKernel() {
  if (kernel !== undefined) return kernel;
  kernel = null;
  try {
    const bytes = Uint8Array.from(atob(NOISE_WASM), (c) => c.charCodeAt(0));
    if (typeof WebAssembly === "object" && WebAssembly.validate(bytes)) {
      const { memory, fill } = new WebAssembly.Instance(new WebAssembly.Module(bytes), {}).exports;
      kernel = {
        fill,
        state: new Int32Array(memory.buffer, 0, N), // the memory never grows: views stay valid
        values: new Float32Array(memory.buffer, WASM_OUT, CHUNK_GROUPS * 16),
      };
    }
  } catch {
    kernel = null; // e.g. a Content-Security-Policy without wasm-unsafe-eval: the JavaScript
                   // path draws the same seed (values within the same ulp of torch's)
  }
  return kernel;
}

// torch.randn(count values, generator=torch.Generator().manual_seed(seed)) as a Float32Array
// (a shape's values in C order). seed: anything checkSeed takes.
export function torchRandn(count, seed) {
  if (!Number.isSafeInteger(count) || count < 0) {
    throw new Error(`count ${count} must be a whole number of values`);
  }
  const engine = new Engine(Number(BigInt.asUintN(32, checkSeed(seed))) | 0);
  if (count < 16) return fewNormals(engine, count);
  const out = new Float32Array(count);
  const whole = count - (count % 16);
  const simd = simdKernel();
  if (simd !== null) {
    // the engine's words move into the kernel's memory, and the engine reads them from there
    // for the tail below; values come back a chunk at a time (out.set is a memcpy, and a
    // chunk stays in cache), so the kernel's memory stays one page whatever the count
    simd.state.set(engine.mt);
    engine.mt = simd.state;
    const groups = whole / 16;
    for (let g = 0; g < groups; g += CHUNK_GROUPS) {
      const n = Math.min(CHUNK_GROUPS, groups - g);
      simd.fill(n);
      out.set(n === CHUNK_GROUPS ? simd.values : simd.values.subarray(0, n * 16), g * 16);
    }
    engine.index = ((groups - 1) % 39 + 1) * 16; // words used of the last twist
  } else {
    const mt = engine.mt;
    // 624 = 39 * 16: each twist's words are whole groups, read in place
    for (let o = 0; o < whole; o += N) {
      twist(mt);
      const used = Math.min(N, whole - o);
      fillGroups(mt, used, out, o, LOG_T, COS_SIN);
      engine.index = used;
    }
  }
  redrawTail(engine, out, whole);
  return out;
}

// The values past the last whole group took a word each; PyTorch then draws the last 16
// values again from 16 fresh words.
function redrawTail(engine, out, whole) {
  if (whole === out.length) return;
  for (let i = whole; i < out.length; i++) engine.raw();
  const fresh = new Int32Array(16);
  for (let i = 0; i < 16; i++) fresh[i] = engine.raw();
  fillGroups(fresh, 16, out, out.length - 16, LOG_T, COS_SIN);
}

// Consecutive torch.randn draws of one generator seeded with `seed`, counts[i] values each
// (edge/core/noise.py torch_randn_draws): what a pipeline draws after the initial latents from the
// same generator (LTX-Video's decode noise), as Float32Arrays. A later draw starts where the
// one before left the engine, mid-twist, so its words are read one at a time and grouped here
// rather than by the SIMD kernel (which starts at a twist): about 2x slower, once per
// generation. A draw under 16 values before another is refused, as in Python (PyTorch keeps
// half of its last pair for the next draw, which is not mirrored).
export function torchRandnDraws(counts, seed) {
  if (counts.slice(0, -1).some((c) => c < 16)) {
    throw new Error(`noise draws ${JSON.stringify(counts)}: ` +
                    "only the last may hold under 16 values");
  }
  const engine = new Engine(Number(BigInt.asUintN(32, checkSeed(seed))) | 0);
  return counts.map((count) => {
    if (!Number.isSafeInteger(count) || count < 0) {
      throw new Error(`count ${count} must be a whole number of values`);
    }
    if (count < 16) return fewNormals(engine, count);
    const out = new Float32Array(count);
    const whole = count - (count % 16);
    const words = new Int32Array(whole);
    for (let i = 0; i < whole; i++) words[i] = engine.raw();
    fillGroups(words, whole, out, 0, LOG_T, COS_SIN);
    redrawTail(engine, out, whole);
    return out;
  });
}
