import Foundation

// A mirror of edge/core/schedulers.py's `flow_unipc` parts, which FlowUniPC (Schedulers.swift)
// puts together: UniPC's flow sigmas and model times, the whole-step times of a leap's tail,
// and UniPCFlow (order 2, bh2, predicting x0; its Solver) with the same float32 arithmetic,
// operation for operation, as NumPy does it there.
//
// One thing is not bit for bit: NumPy computes float32 `log` and `expm1` with its own SIMD
// routines (a few ULP, not correctly rounded, and different from one CPU to the next); here
// they are rounded once from the float64 result. A step's scalars can then differ in their
// last bits, and the latents by a few float32 ULP (tests/fixtures/swift/unipc.json: at most
// 2.7e-7 on latents of size ~1, on an AVX-512 machine). Everything else, the sigmas and the
// model times included, is exact.

/// shift * s / (1 + (shift - 1) * s) in float64, as NumPy computes it on a float64 array.
func shiftSigma64(_ s: Double, _ shift: Double) -> Double {
    shift * s / (1 + (shift - 1) * s)
}

/// UniPCMultistepScheduler.set_timesteps with use_flow_sigmas, float64, without the final 0:
/// linspace(1, 1/N, steps + 1) without its end (or the `given` levels), shifted, the first
/// nudged below 1.
func unipcFlowSigmas(steps: Int, shift: Double, numTrainTimesteps: Int,
                     given: [Double]? = nil) -> [Double] {
    let stop = 1.0 / Double(numTrainTimesteps)
    let step = (stop - 1.0) / Double(steps)  // np.linspace: i * step + start
    var sigmas = (0..<steps).map { shiftSigma64(given?[$0] ?? Double($0) * step + 1.0, shift) }
    if abs(sigmas[0] - 1.0) < 1e-6 { sigmas[0] -= 1e-6 }
    return sigmas
}

/// UniPC's flow sigmas with a final 0, float32 (steps + 1 values).
public func unipcSigmas(steps: Int, shift: Double, numTrainTimesteps: Int,
                        given: [Double]? = nil) -> [Float] {
    unipcFlowSigmas(steps: steps, shift: shift, numTrainTimesteps: numTrainTimesteps, given: given)
        .map(Float.init) + [0]
}

/// What UniPC tells the model the time is: int64(sigma * N) of the float64 sigmas, over N.
public func unipcModelTimes(steps: Int, shift: Double, numTrainTimesteps: Int,
                            given: [Double]? = nil) -> [Float] {
    wholeStepTimes(
        unipcFlowSigmas(steps: steps, shift: shift, numTrainTimesteps: numTrainTimesteps,
                        given: given),
        numTrainTimesteps: numTrainTimesteps)
}

/// Each sigma rounded down to a whole training step, as a fraction of N (float32).
public func wholeStepTimes(_ sigmas: [Double], numTrainTimesteps: Int) -> [Float] {
    let n = Double(numTrainTimesteps)
    return sigmas.map { Float(Double(Int64(($0 * n).rounded(.towardZero))) / n) }
}

public func wholeStepTimes(_ sigmas: [Float], numTrainTimesteps: Int) -> [Float] {
    wholeStepTimes(sigmas.map(Double.init), numTrainTimesteps: numTrainTimesteps)
}

/// The 2x2 system a x = b as `np.linalg.solve` solves it for float32 arrays: NumPy computes
/// in float64 (its solve gufunc is called with signature 'dd->d', LAPACK dgesv) and rounds
/// the answer to float32. dgesv is LU with partial pivoting: the row with the larger |a_i0|
/// is the pivot (the first on a tie, as idamax picks), the column below it is scaled by the
/// pivot's reciprocal (dgetf2), then forward and back substitution with divisions by the
/// diagonal (dgetrs). Done in that order, the float64 results equal OpenBLAS's dgesv bit for
/// bit (checked on 40,000 systems), so the float32 answers equal NumPy's.
public func solve2x2(_ a: [[Float]], _ b: [Float]) -> [Float] {
    var a00 = Double(a[0][0]), a01 = Double(a[0][1]), a10 = Double(a[1][0]), a11 = Double(a[1][1])
    var b0 = Double(b[0]), b1 = Double(b[1])
    if abs(a10) > abs(a00) {
        swap(&a00, &a10); swap(&a01, &a11); swap(&b0, &b1)
    }
    let l = a10 * (1.0 / a00)
    let u11 = a11 - l * a01
    let y1 = b1 - l * b0
    let x1 = y1 / u11
    let x0 = (b0 - a01 * x1) / a00
    return [Float(x0), Float(x1)]
}

/// log(alpha / sigma) of a flow sigma (alpha = 1 - sigma), float32; +inf at sigma = 0.
/// Each float32 log is the float64 log rounded (see the note at the top).
func unipcLambda(_ sigma: Float) -> Float {
    Float(log(Double(1 - sigma))) - Float(log(Double(sigma)))
}

func expm1Float(_ x: Float) -> Float { Float(expm1(Double(x))) }

/// One generation's UniPC state (order 2, bh2, predicting x0), as UniPCFlow in
/// edge/core/schedulers.py: FlowUniPC's solver. `step(v:i:x:)` takes the guided velocity at
/// sigmas[i] and returns the sample at sigmas[i + 1]. Scalars and arrays are float32, each
/// operation rounded as NumPy rounds it (no fused multiply-adds).
public final class UniPCFlow: Solver {
    public static let order = 2
    public let sigmas: [Float]
    var x0History: [[Float]] = []   // the last `order` converted outputs
    var lastSample: [Float]?
    var lastOrder = 0

    public init(sigmas: [Float]) { self.sigmas = sigmas }

    /// alpha_t, sigma_t / sigma_s0, h_phi_1 = expm1(-h) and h for a step from sigmas[iS0] to
    /// sigmas[iT]. With bh2, B_h is h_phi_1 too.
    func coefficients(_ iS0: Int, _ iT: Int)
        -> (alphaT: Float, ratio: Float, hPhi1: Float, h: Float) {
        let sigmaT = sigmas[iT], sigmaS0 = sigmas[iS0]
        let h = unipcLambda(sigmaT) - unipcLambda(sigmaS0)
        return (1 - sigmaT, sigmaT / sigmaS0, expm1Float(-h), h)
    }

    func rk(_ iSi: Int, _ iS0: Int, _ h: Float) -> Float {
        (unipcLambda(sigmas[iSi]) - unipcLambda(sigmas[iS0])) / h
    }

    /// b_k = h_phi_k * k! / B_h for k = 1..order (bh2: B_h = expm1(-h)).
    func bTerms(_ h: Float, _ order: Int) -> [Float] {
        let hh = -h
        let hPhi1 = expm1Float(hh)
        var hPhiK = hPhi1 / hh - 1
        var factorial = 1
        var b: [Float] = []
        for k in 1...order {
            b.append(hPhiK * Float(factorial) / hPhi1)
            factorial *= k + 1
            hPhiK = hPhiK / hh - Float(1.0 / Double(factorial))
        }
        return b
    }

    /// UniC: refine the sample at sigmas[i] with the new x0 prediction.
    func correct(_ x0: [Float], _ i: Int) -> [Float] {
        let m0 = x0History[x0History.count - 1], last = lastSample!
        let (alphaT, ratio, hPhi1, h) = coefficients(i - 1, i)
        let c = alphaT * hPhi1
        var out = [Float](repeating: 0, count: x0.count)
        if lastOrder == 1 {
            let rho: Float = 0.5
            for j in out.indices {
                let xT = ratio * last[j] - c * m0[j]
                out[j] = xT - c * (Float(0) + rho * (x0[j] - m0[j]))
            }
        } else {  // order 2: one earlier output, solve the 2x2 system R rho = b
            let r = rk(i - 2, i - 1, h)
            let earlier = x0History[x0History.count - 2]
            let rhos = solve2x2([[1, 1], [r, 1]], bTerms(h, 2))
            for j in out.indices {
                let d1 = (earlier[j] - m0[j]) / r
                let corr = Float(0) + rhos[0] * d1
                let xT = ratio * last[j] - c * m0[j]
                out[j] = xT - c * (corr + rhos[1] * (x0[j] - m0[j]))
            }
        }
        return out
    }

    /// UniP: the sample at sigmas[i + 1].
    func predict(_ i: Int, _ x: [Float], _ order: Int) -> [Float] {
        let m0 = x0History[x0History.count - 1]
        let (alphaT, ratio, hPhi1, h) = coefficients(i, i + 1)
        let c = alphaT * hPhi1
        var out = [Float](repeating: 0, count: x.count)
        if order == 1 {
            for j in out.indices { out[j] = ratio * x[j] - c * m0[j] }
            return out
        }
        let r = rk(i - 1, i, h)
        let earlier = x0History[x0History.count - 2]
        for j in out.indices {
            let d1 = (earlier[j] - m0[j]) / r
            out[j] = (ratio * x[j] - c * m0[j]) - c * (Float(0.5) * d1)
        }
        return out
    }

    public func step(v: Tensor, i: Int, x: Tensor) -> Tensor {
        let sigma = sigmas[i]
        let x0 = zip(x.data, v.data).map { $0 - sigma * $1 }
        var sample = x.data
        if i > 0 && lastSample != nil { sample = correct(x0, i) }
        x0History = Array((x0History + [x0]).suffix(Self.order))
        let steps = sigmas.count - 1
        let order = min(Self.order, steps - i, x0History.count)
        lastSample = sample
        lastOrder = order
        return Tensor(shape: x.shape, data: predict(i, sample, order))
    }
}
