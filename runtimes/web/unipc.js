// The math of the `flow_unipc` scheduler of edge/core/schedulers.py (Wan 2.1's default), mirrored
// for the browser: UniPC's flow sigmas and model times, the whole-step times of a leap's tail,
// and UniPCFlow (order 2, bh2, predicting x0), the solver FlowUniPC (schedulers.js) hands the
// sampler. runtimes/swift/Sources/EdgeCore/UniPC.swift is the same mirror in Swift;
// tests/fixtures/swift/unipc.json and schedulers.json (tests/swift_fixtures.py) hold both to
// the Python numbers (tests/test_web_mirrors.py replays them here).
//
// Rounding. NumPy keeps UniPC's scalars and arrays in float32, one rounding per operation, so
// every operation here is rounded with Math.fround in the same order (no fused or reordered
// arithmetic). The sigmas are computed in float64 first, as NumPy does on its float64
// linspace, and rounded once. One thing is not bit for bit: NumPy's float32 `log` and `expm1`
// are its own SIMD routines (a few ULP, CPU dependent); here they are the float64 results
// rounded once, as in the Swift runtime. The step scalars can then differ in their last bits,
// and the latents by a few float32 ULP (measured in tests/test_web_mirrors.py).

const f32 = Math.fround;

// shift * s / (1 + (shift - 1) * s) in float64, as NumPy computes it on a float64 array
function shiftSigma64(s, shift) {
  return shift * s / (1 + (shift - 1) * s);
}

// UniPCMultistepScheduler.set_timesteps with use_flow_sigmas, float64, without the final 0:
// linspace(1, 1/N, steps + 1) without its end (np.linspace: i * step + start), shifted, the
// first nudged below 1.
function unipcFlowSigmas(steps, shift, numTrainTimesteps, given = null) {
  const step = (1.0 / numTrainTimesteps - 1.0) / steps;
  const sigmas = new Float64Array(steps);
  for (let i = 0; i < steps; i++) {
    sigmas[i] = shiftSigma64(given ? given[i] : i * step + 1.0, shift);
  }
  if (Math.abs(sigmas[0] - 1.0) < 1e-6) sigmas[0] -= 1e-6;
  return sigmas;
}

// UniPC's flow sigmas with a final 0, float32 (steps + 1 values)
export function unipcSigmas(steps, shift, numTrainTimesteps, given = null) {
  const out = new Float32Array(steps + 1);
  out.set(unipcFlowSigmas(steps, shift, numTrainTimesteps, given)); // rounds each to float32
  return out;
}

// What UniPC tells the model the time is: int64(sigma * N) of the float64 sigmas, over N
export function unipcModelTimes(steps, shift, numTrainTimesteps, given = null) {
  return wholeStepTimes(unipcFlowSigmas(steps, shift, numTrainTimesteps, given), numTrainTimesteps);
}

// Each sigma (float32 or float64 values) rounded down to a whole training step, as a fraction
// of N, float32. NumPy multiplies in float64 and truncates toward zero (astype(int64)).
export function wholeStepTimes(sigmas, numTrainTimesteps) {
  const out = new Float32Array(sigmas.length);
  for (let i = 0; i < sigmas.length; i++) {
    out[i] = Math.trunc(sigmas[i] * numTrainTimesteps) / numTrainTimesteps;
  }
  return out;
}

// The 2x2 system a x = b as np.linalg.solve solves it for float32 arrays: NumPy solves in
// float64 (LAPACK dgesv: LU with partial pivoting, the row with the larger |a_i0| as pivot,
// the first on a tie; the column scaled by the pivot's reciprocal; then forward and back
// substitution dividing by the diagonal) and rounds the answer to float32. In that order the
// float64 results equal OpenBLAS's bit for bit (see solve2x2 in UniPC.swift).
export function solve2x2(a, b) {
  let [a00, a01] = a[0], [a10, a11] = a[1], [b0, b1] = b;
  if (Math.abs(a10) > Math.abs(a00)) {
    [a00, a01, b0, a10, a11, b1] = [a10, a11, b1, a00, a01, b0];
  }
  const l = a10 * (1.0 / a00);
  const u11 = a11 - l * a01;
  const x1 = (b1 - l * b0) / u11;
  const x0 = (b0 - a01 * x1) / a00;
  return [f32(x0), f32(x1)];
}

// log(alpha / sigma) of a flow sigma (alpha = 1 - sigma) as NumPy computes it on float32:
// log(1 - sigma) - log(sigma), each log rounded to float32 (see the note at the top); +inf
// at sigma = 0.
function lambda(sigma) {
  return f32(f32(Math.log(f32(1 - sigma))) - f32(Math.log(sigma)));
}

const expm1F32 = (x) => f32(Math.expm1(x));

// One generation's UniPC state, as UniPCFlow in edge/core/schedulers.py. step(v, i, x) takes the
// guided velocity at sigmas[i] and returns the sample at sigmas[i + 1] (Float32Arrays).
export class UniPCFlow {
  static order = 2;

  constructor(sigmas) {
    this.sigmas = Float32Array.from(sigmas);
    this.x0History = []; // the last `order` converted outputs
    this.lastSample = null;
    this.lastOrder = 0;
  }

  // alpha_t, sigma_t / sigma_s0, h_phi_1 = expm1(-h) and h for a step from sigmas[iS0] to
  // sigmas[iT]; with bh2, B_h is h_phi_1 too
  coefficients(iS0, iT) {
    const sigmaT = this.sigmas[iT], sigmaS0 = this.sigmas[iS0];
    const h = f32(lambda(sigmaT) - lambda(sigmaS0));
    return { alphaT: f32(1 - sigmaT), ratio: f32(sigmaT / sigmaS0), hPhi1: expm1F32(f32(-h)), h };
  }

  rk(iSi, iS0, h) {
    return f32(f32(lambda(this.sigmas[iSi]) - lambda(this.sigmas[iS0])) / h);
  }

  // b_k = h_phi_k * k! / B_h for k = 1..order (bh2: B_h = expm1(-h)); NumPy keeps the
  // float32 scalars float32 against Python ints and floats, so every step rounds
  bTerms(h, order) {
    const hh = f32(-h);
    const hPhi1 = expm1F32(hh);
    let hPhiK = f32(f32(hPhi1 / hh) - 1);
    let factorial = 1;
    const b = [];
    for (let k = 1; k <= order; k++) {
      b.push(f32(f32(hPhiK * factorial) / hPhi1));
      factorial *= k + 1;
      hPhiK = f32(f32(hPhiK / hh) - f32(1 / factorial));
    }
    return b;
  }

  // UniC: refine the sample at sigmas[i] with the new x0 prediction
  correct(x0, i) {
    const m0 = this.x0History[this.x0History.length - 1], last = this.lastSample;
    const { alphaT, ratio, hPhi1, h } = this.coefficients(i - 1, i);
    const c = f32(alphaT * hPhi1); // (alpha_t * h_phi_1) first: NumPy evaluates left to right
    const out = new Float32Array(x0.length);
    if (this.lastOrder === 1) {
      const rho = f32(0.5);
      for (let j = 0; j < out.length; j++) {
        const xT = f32(f32(ratio * last[j]) - f32(c * m0[j]));
        // corr is sum() of nothing: np.float32(0), still added
        out[j] = f32(xT - f32(c * f32(0 + f32(rho * f32(x0[j] - m0[j])))));
      }
      return out;
    }
    // order 2: one earlier output, solve the 2x2 system R rho = b
    const r = this.rk(i - 2, i - 1, h);
    const earlier = this.x0History[this.x0History.length - 2];
    const [rho0, rho1] = solve2x2([[1, 1], [r, 1]], this.bTerms(h, 2));
    for (let j = 0; j < out.length; j++) {
      const d1 = f32(f32(earlier[j] - m0[j]) / r);
      const corr = f32(0 + f32(rho0 * d1));
      const xT = f32(f32(ratio * last[j]) - f32(c * m0[j]));
      out[j] = f32(xT - f32(c * f32(corr + f32(rho1 * f32(x0[j] - m0[j])))));
    }
    return out;
  }

  // UniP: the sample at sigmas[i + 1]
  predict(i, x, order) {
    const m0 = this.x0History[this.x0History.length - 1];
    const { alphaT, ratio, hPhi1, h } = this.coefficients(i, i + 1);
    const c = f32(alphaT * hPhi1);
    const out = new Float32Array(x.length);
    if (order === 1) {
      for (let j = 0; j < out.length; j++) out[j] = f32(f32(ratio * x[j]) - f32(c * m0[j]));
      return out;
    }
    const r = this.rk(i - 1, i, h);
    const earlier = this.x0History[this.x0History.length - 2];
    const half = f32(0.5);
    for (let j = 0; j < out.length; j++) {
      const d1 = f32(f32(earlier[j] - m0[j]) / r);
      const xT = f32(f32(ratio * x[j]) - f32(c * m0[j]));
      out[j] = f32(xT - f32(c * f32(half * d1)));
    }
    return out;
  }

  step(v, i, x) {
    const sigma = this.sigmas[i];
    const x0 = new Float32Array(x.length);
    for (let j = 0; j < x0.length; j++) x0[j] = f32(x[j] - f32(sigma * v[j]));
    let sample = x;
    if (i > 0 && this.lastSample !== null) sample = this.correct(x0, i);
    this.x0History = [...this.x0History, x0].slice(-UniPCFlow.order);
    const steps = this.sigmas.length - 1;
    const order = Math.min(UniPCFlow.order, steps - i, this.x0History.length);
    this.lastSample = sample;
    this.lastOrder = order;
    return this.predict(i, sample, order);
  }
}
