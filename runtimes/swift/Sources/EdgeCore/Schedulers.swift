import Foundation

// A mirror of edge/core/schedulers.py's classes: one type per scheduler with one small interface
// (`Scheduler`), looked up by the manifest's `sampler.scheduler` name (`schedulers`,
// `scheduler(named:shift:numTrainTimesteps:)`). The sampler (Sampler.swift) asks a scheduler only
// for what this interface gives: the noise levels and model times of a step count, the solver that
// steps through them, and what a leap asks (the re-planned tail, the jump to t = 0). The flow-match
// Euler schedules (flow_euler's, LTX-Video's), a leap's tail and CogVideoX's DDIM are computed
// here; UniPC's flow sigmas and its solver are in UniPC.swift. Float32 arithmetic as NumPy's,
// operation for operation: tests/fixtures/swift/schedulers.json (tests/swift_fixtures.py
// scheduler_cases) is replayed through the registry by name.
//
// The flows take the model's velocity v = noise - x0 (x_t = (1 - t) x0 + t noise);
// cogvideox_ddim takes a v-prediction on its training timesteps. `modelTimes` are what the
// transformer is told the time is, in [0, 1].

/// One generation's stepping through a schedule's noise levels (EulerSolver, UniPCFlow):
/// `step(v:i:x:)` takes the guided velocity at sigmas[i] and returns the sample at
/// sigmas[i + 1]. A reference type: a multistep solver keeps its history between steps.
public protocol Solver: AnyObject {
    var sigmas: [Float] { get }
    func step(v: Tensor, i: Int, x: Tensor) -> Tensor
}

extension Solver {
    /// `step(v:i:x:)` with the arguments in order, as Python's `step(v, i, x)`.
    public func step(_ v: Tensor, _ i: Int, _ x: Tensor) -> Tensor { step(v: v, i: i, x: x) }
}

/// What the sampler asks of a scheduler (Scheduler in edge/core/schedulers.py). `name` is the
/// manifest's `sampler.scheduler`; `leapTail`: whether `tail` re-plans a leap's rest in
/// several steps (true for the flows, by default). Without one a leap is one `jump`, and a
/// leap_steps over 1 is refused with the settings (SamplerSettings.validate()).
/// `takesShiftTerminal`: whether the schedule takes a shift_terminal (Python's
/// takes_shift_terminal; false by default, and settings with one are then refused).
/// `takesDynamicGuidance`: whether its levels are the whole training timesteps CogVideoX's
/// dynamic guidance reads (Python's takes_dynamic_guidance; false by default, and settings
/// with dynamic_guidance are then refused). `takesSigmas`: whether given noise levels can
/// replace its spacing (Python's takes_sigmas; false by default, and settings with sigmas
/// are then refused).
public protocol Scheduler {
    static var name: String { get }
    var name: String { get }
    static var leapTail: Bool { get }
    static var takesShiftTerminal: Bool { get }
    static var takesDynamicGuidance: Bool { get }
    static var takesSigmas: Bool { get }
    var shift: Double { get }
    var numTrainTimesteps: Int { get }
    /// The last noise level before 0 the schedule is stretched to; nil: no stretch.
    var shiftTerminal: Double? { get }

    init(shift: Double, numTrainTimesteps: Int)

    /// As `init(shift:numTrainTimesteps:)`, with the settings' shift_terminal (one that takes
    /// none ignores it: validated settings give it nil).
    init(shift: Double, numTrainTimesteps: Int, shiftTerminal: Double?)

    /// The levels of `steps` steps (float32, falling, steps + 1 values; a flow's are its noise
    /// levels 1 > ... > 0) and what the transformer is told the time of each is (steps
    /// values, in [0, 1]). `given`: `steps` levels in place of the schedule's own spacing, as
    /// diffusers' set_timesteps(sigmas=...) takes them (only where `takesSigmas`).
    func schedule(steps: Int, given: [Double]?) -> (sigmas: [Float], modelTimes: [Float])

    /// A leap's re-planned rest: `steps` steps from tFrom down to tMin spaced as this
    /// schedule spaces its own, then 0 (steps + 1 values); and their model times (steps).
    /// Asked only of a scheduler whose `leapTail` is true: one without stops the program
    /// (valid settings never ask it, as Python's raises).
    func tail(from tFrom: Float, min tMin: Float, steps: Int)
        -> (sigmas: [Float], modelTimes: [Float])

    /// One generation's stepping through `sigmas`, fresh.
    func solver(sigmas: [Float]) -> any Solver

    /// A one-step leap from `sigma` straight to the end: the clean sample the velocity
    /// predicts.
    func jump(x: Tensor, v: Tensor, sigma: Float) -> Tensor
}

extension Scheduler {
    public var name: String { Self.name }

    /// A flow re-plans a leap's tail (Python's class attribute `leap_tail = True`).
    public static var leapTail: Bool { true }

    /// `Self.leapTail`, asked of an instance.
    public var leapTail: Bool { Self.leapTail }

    public static var takesShiftTerminal: Bool { false }

    public static var takesDynamicGuidance: Bool { false }

    public static var takesSigmas: Bool { false }

    public var shiftTerminal: Double? { nil }

    /// The schedule's own spacing (no given levels).
    public func schedule(steps: Int) -> (sigmas: [Float], modelTimes: [Float]) {
        schedule(steps: steps, given: nil)
    }

    public init(shift: Double, numTrainTimesteps: Int, shiftTerminal: Double?) {
        self.init(shift: shift, numTrainTimesteps: numTrainTimesteps)
    }

    /// For a flow: x - sigma v (an Euler step to 0), as Python's `euler_step(x, v, sigma, 0)`.
    public func jump(x: Tensor, v: Tensor, sigma: Float) -> Tensor { eulerStep(x, v, sigma, 0) }
}

/// A flow stepped by Euler with the sigmas as model times (flow_euler, ltx_flow_euler): a
/// leap's tail is evenly spaced before the shift, whatever the schedule (Python's
/// FlowEulerLTX subclasses FlowEuler for the same two methods).
public protocol EulerFlow: Scheduler {
    var shift: Double { get }
}

extension EulerFlow {
    public func tail(from tFrom: Float, min tMin: Float, steps: Int)
        -> (sigmas: [Float], modelTimes: [Float]) {
        let sigmas = EdgeCore.leapTail(from: tFrom, to: tMin, steps: steps, shift: shift)
        return (sigmas, Array(sigmas.dropLast()))
    }

    public func solver(sigmas: [Float]) -> any Solver { EulerSolver(sigmas: sigmas) }
}

/// FlowMatchEulerDiscreteScheduler with a static shift (tiny-sora): model times are the
/// sigmas.
public struct FlowEuler: EulerFlow {
    public static let name = "flow_euler"
    public static var takesSigmas: Bool { true }
    public let shift: Double
    public let numTrainTimesteps: Int

    public init(shift: Double, numTrainTimesteps: Int) {
        self.shift = shift
        self.numTrainTimesteps = numTrainTimesteps
    }

    public func schedule(steps: Int, given: [Double]?) -> (sigmas: [Float], modelTimes: [Float]) {
        let sigmas = eulerSigmas(steps: steps, shift: shift, numTrainTimesteps: numTrainTimesteps,
                                 given: given)
        return (sigmas, Array(sigmas.dropLast()))
    }
}

/// FlowMatchEulerDiscreteScheduler as LTXPipeline sets it (edge/core/schedulers.py FlowEulerLTX,
/// `ltxSigmas`): `shift` is exp(mu), `shiftTerminal` the last level before 0 (nil: no
/// stretch); model times are the sigmas. Its steps and a leap's tail are flow_euler's with
/// the same shift (evenly spaced before it, the terminal stretch not applied again).
public struct FlowEulerLTX: EulerFlow {
    public static let name = "ltx_flow_euler"
    public static var takesShiftTerminal: Bool { true }
    public static var takesSigmas: Bool { true }
    public let shift: Double
    public let numTrainTimesteps: Int
    public let shiftTerminal: Double?

    public init(shift: Double, numTrainTimesteps: Int, shiftTerminal: Double?) {
        self.shift = shift
        self.numTrainTimesteps = numTrainTimesteps
        self.shiftTerminal = shiftTerminal
    }

    public init(shift: Double, numTrainTimesteps: Int) {
        self.init(shift: shift, numTrainTimesteps: numTrainTimesteps, shiftTerminal: nil)
    }

    public func schedule(steps: Int, given: [Double]?) -> (sigmas: [Float], modelTimes: [Float]) {
        let sigmas = ltxSigmas(steps: steps, shift: shift, shiftTerminal: shiftTerminal,
                               given: given)
        return (sigmas, Array(sigmas.dropLast()))
    }
}

/// Open-Sora 1.2's RFLOW (edge/core/schedulers.py RFlow): flow_euler's static shift (the video
/// size's ratio r) on the levels (1 - i/N), np.linspace(1, 1/N, N); model times are the sigmas.
public struct RFlow: EulerFlow {
    public static let name = "rflow"
    public static var takesSigmas: Bool { true }
    public let shift: Double
    public let numTrainTimesteps: Int

    public init(shift: Double, numTrainTimesteps: Int) {
        self.shift = shift
        self.numTrainTimesteps = numTrainTimesteps
    }

    public func schedule(steps: Int, given: [Double]?) -> (sigmas: [Float], modelTimes: [Float]) {
        let n = steps
        let levels = given ?? (0..<n).map { i in  // np.linspace(1.0, 1 / n, n), the last exact
            n == 1 ? 1.0
                : (i == n - 1 ? 1.0 / Double(n)
                   : Double(i) * ((1.0 / Double(n) - 1.0) / Double(n - 1)) + 1.0)
        }
        let sigmas = eulerSigmas(steps: n, shift: shift, numTrainTimesteps: numTrainTimesteps,
                                 given: levels)
        return (sigmas, Array(sigmas.dropLast()))
    }
}

/// UniPCMultistepScheduler as Wan 2.1 configures it (flow prediction, flow sigmas with
/// `flow_shift`, order 2, bh2; UniPC.swift): model times are whole training steps.
public struct FlowUniPC: Scheduler {
    public static let name = "flow_unipc"
    public static var takesSigmas: Bool { true }
    public let shift: Double
    public let numTrainTimesteps: Int

    public init(shift: Double, numTrainTimesteps: Int) {
        self.shift = shift
        self.numTrainTimesteps = numTrainTimesteps
    }

    public func schedule(steps: Int, given: [Double]?) -> (sigmas: [Float], modelTimes: [Float]) {
        (unipcSigmas(steps: steps, shift: shift, numTrainTimesteps: numTrainTimesteps,
                     given: given),
         unipcModelTimes(steps: steps, shift: shift, numTrainTimesteps: numTrainTimesteps,
                         given: given))
    }

    public func tail(from tFrom: Float, min tMin: Float, steps: Int)
        -> (sigmas: [Float], modelTimes: [Float]) {
        let sigmas = EdgeCore.leapTail(from: tFrom, to: tMin, steps: steps, shift: shift)
        return (sigmas,
                wholeStepTimes(Array(sigmas.dropLast()), numTrainTimesteps: numTrainTimesteps))
    }

    public func solver(sigmas: [Float]) -> any Solver { UniPCFlow(sigmas: sigmas) }
}

/// `CogVideoXDDIMScheduler` as CogVideoX ships it: v-prediction, scaled-linear betas from
/// 0.00085 to 0.012, the SNR shift of SD3 by `shift` (diffusers' `snr_shift_scale`), zero
/// terminal SNR, trailing timesteps, eta 0, the final alpha 1. Its levels are its training
/// timesteps, then -1 for the clean end; like diffusers it steps from t to t - N / steps
/// (whole), which is not always the next timestep of its own list (steps that do not divide
/// N). A leap is one jump to the clean sample the v-prediction gives; a re-planned DDIM tail
/// is not built (`leapTail` false). Scalars in float64 as Python's, products in float32.
public struct CogVideoXDDIM: Scheduler {
    public static let name = "cogvideox_ddim"
    public static var leapTail: Bool { false }
    public static var takesDynamicGuidance: Bool { true }
    public static let betaStart = 0.00085, betaEnd = 0.012
    public let shift: Double
    public let numTrainTimesteps: Int
    /// alphas_cumprod after the SNR shift and the zero-terminal-SNR rescale (float64).
    public let alphasCumprod: [Double]

    public init(shift: Double, numTrainTimesteps: Int) {
        self.shift = shift
        self.numTrainTimesteps = numTrainTimesteps
        // np.linspace(beta_start ** 0.5, beta_end ** 0.5, N, dtype=float64) ** 2
        let n = numTrainTimesteps
        let betas = linspace(pow(Self.betaStart, 0.5), pow(Self.betaEnd, 0.5), n).map { $0 * $0 }
        var product = 1.0
        var alphas = [Double]()
        alphas.reserveCapacity(n)
        for beta in betas {  // np.cumprod(1.0 - betas), in order
            product *= 1.0 - beta
            alphas.append(product)
        }
        alphasCumprod = rescaleZeroTerminalSNR(alphas.map { $0 / (shift + (1 - shift) * $0) })
    }

    /// diffusers' trailing spacing: round(arange(N, 0, -N / steps)) - 1 (np.arange with a
    /// float step, np.round half to even).
    public func timesteps(steps: Int) -> [Int] {
        let n = numTrainTimesteps
        return arange(Double(n), 0, -Double(n) / Double(steps))
            .map { Int($0.rounded(.toNearestOrEven)) - 1 }
    }

    public func schedule(steps: Int, given: [Double]?) -> (sigmas: [Float], modelTimes: [Float]) {
        precondition(given == nil, "\(name) takes no given levels")  // refused by validate()
        let t = timesteps(steps: steps)
        return (t.map { Float($0) } + [-1],
                t.map { Float(Double($0) / Double(numTrainTimesteps)) })
    }

    public func tail(from tFrom: Float, min tMin: Float, steps: Int)
        -> (sigmas: [Float], modelTimes: [Float]) {
        preconditionFailure("\(name) leaps in one step only (leap_steps=1)")
    }

    public func solver(sigmas: [Float]) -> any Solver {
        DDIMSolver(sigmas: sigmas, alphasCumprod: alphasCumprod,
                   stride: numTrainTimesteps / (sigmas.count - 1))
    }

    /// The clean sample the v-prediction gives at level `sigma` (a training timestep).
    public func jump(x: Tensor, v: Tensor, sigma: Float) -> Tensor {
        let t = Int(sigma)  // int(sigma); a negative index counts from the end, as NumPy's
        return ddimX0(x, v, alphasCumprod[t < 0 ? alphasCumprod.count + t : t])
    }
}

/// diffusers' DDIM step (eta 0) on a v-prediction (Python's DDIMSolver): from timestep t to
/// t - stride (the clean end, alpha 1, past 0): x0 = sqrt(a_t) x - sqrt(1 - a_t) v, then
/// x' = A x + B x0. The scalars are float64, as diffusers keeps alphas_cumprod; each product
/// is float32, as torch multiplies a float32 sample by a 0-d float64 tensor. `sigmas` are the
/// schedule's levels (timesteps, then -1).
public final class DDIMSolver: Solver {
    public let sigmas: [Float]
    public let timesteps: [Int]
    public let alphasCumprod: [Double]
    public let stride: Int

    public init(sigmas: [Float], alphasCumprod: [Double], stride: Int) {
        self.sigmas = sigmas
        self.timesteps = sigmas.dropLast().map { Int($0) }
        self.alphasCumprod = alphasCumprod
        self.stride = stride
    }

    /// alphas_cumprod[t], 1 before the start (set_alpha_to_one).
    public func alpha(_ t: Int) -> Double { t >= 0 ? alphasCumprod[t] : 1.0 }

    public func step(v: Tensor, i: Int, x: Tensor) -> Tensor {
        let t = timesteps[i]
        let aT = alpha(t), aPrev = alpha(t - stride)
        let x0 = ddimX0(x, v, aT)
        let a = ((1 - aPrev) / (1 - aT)).squareRoot()
        let b = aPrev.squareRoot() - aT.squareRoot() * a
        let fa = Float(a), fb = Float(b)
        return Tensor(shape: x.shape, data: zip(x.data, x0.data).map { fa * $0 + fb * $1 })
    }
}

/// The clean sample a v-prediction gives at a level of alphas_cumprod `alpha` (ddim_x0):
/// float32(sqrt(alpha)) x - float32(sqrt(1 - alpha)) v.
public func ddimX0(_ x: Tensor, _ v: Tensor, _ alpha: Double) -> Tensor {
    let c = Float(alpha.squareRoot()), d = Float((1 - alpha).squareRoot())
    return Tensor(shape: x.shape, data: zip(x.data, v.data).map { c * $0 - d * $1 })
}

/// Lin et al.'s rescale (rescale_zero_terminal_snr, float64): the last timestep's signal to
/// zero, the first's kept.
func rescaleZeroTerminalSNR(_ alphasCumprod: [Double]) -> [Double] {
    let root = alphasCumprod.map { $0.squareRoot() }
    guard let first = root.first, let last = root.last else { return [] }
    let scale = first / (first - last)
    return root.map { r in
        let s = (r - last) * scale
        return s * s
    }
}

/// np.linspace(start, stop, num) in float64: i * step + start with step = (stop - start) /
/// (num - 1), the last value exactly stop (num 1: start alone).
func linspace(_ start: Double, _ stop: Double, _ num: Int) -> [Double] {
    if num <= 0 { return [] }
    if num == 1 { return [start] }
    let div = Double(num - 1), delta = stop - start, step = delta / div
    var out = (0..<num).map { i -> Double in
        // NumPy divides then multiplies when the step underflows to 0
        step == 0 ? Double(i) / div * delta + start : Double(i) * step + start
    }
    out[num - 1] = stop
    return out
}

/// np.arange(start, stop, step) in float64: ceil((stop - start) / step) values; the first is
/// start, the second start + step, and each further one start + i * delta with delta the
/// difference of those two (NumPy's fill).
func arange(_ start: Double, _ stop: Double, _ step: Double) -> [Double] {
    let length = Int(max(0, ((stop - start) / step).rounded(.up)))
    if length == 0 { return [] }
    let second = start + step, delta = second - start
    return (0..<length).map { i in i == 0 ? start : (i == 1 ? second : start + Double(i) * delta) }
}

/// The schedulers by name, in edge/core/schedulers.py's SCHEDULERS order.
public let schedulers: [(name: String, type: any Scheduler.Type)] =
    ([FlowEuler.self, FlowUniPC.self, CogVideoXDDIM.self, FlowEulerLTX.self, RFlow.self]
        as [any Scheduler.Type])
        .map { ($0.name, $0) }

/// The names of `schedulers`, in its order.
public let knownSchedulers = schedulers.map(\.name)

/// The scheduler a manifest's `sampler.scheduler` names (scheduler_for); an unknown name is
/// refused naming the known ones, with Python's message.
public func scheduler(named name: String, shift: Double, numTrainTimesteps: Int,
                      shiftTerminal: Double? = nil) throws -> any Scheduler {
    guard let type = schedulers.first(where: { $0.name == name })?.type else {
        throw SettingsError.invalid(
            "sampler setting scheduler=\(pythonRepr(name)): " +
            "known: \(knownSchedulers.joined(separator: ", "))")
    }
    return type.init(shift: shift, numTrainTimesteps: numTrainTimesteps,
                     shiftTerminal: shiftTerminal)
}

/// Flow-match Euler through `sigmas`: x + (sigma_next - sigma) v, float32.
public final class EulerSolver: Solver {
    public let sigmas: [Float]

    public init(sigmas: [Float]) { self.sigmas = sigmas }

    public func step(v: Tensor, i: Int, x: Tensor) -> Tensor {
        eulerStep(x, v, sigmas[i], sigmas[i + 1])
    }
}

/// One Euler step of a flow: x + (tNext - t) v (to 0: x - t v, the x0 the velocity predicts).
public func eulerStep(_ x: Tensor, _ v: Tensor, _ t: Float, _ tNext: Float) -> Tensor {
    let dt = tNext - t
    return Tensor(shape: x.shape, data: zip(x.data, v.data).map { $0 + dt * $1 })
}

/// shift * s / (1 + (shift - 1) * s), in float32 as NumPy computes it on a float32 array.
func shiftSigma(_ s: Float, _ shift: Double) -> Float {
    Float(shift) * s / (1 + Float(shift - 1) * s)
}

/// FlowMatchEulerDiscreteScheduler.set_timesteps with a static shift (euler_sigmas): a
/// linspace from 1 to the (shifted) smallest training sigma (or the `given` levels), shifted
/// once more in float32, then a final 0.
func eulerSigmas(steps n: Int, shift: Double, numTrainTimesteps: Int,
                 given: [Double]? = nil) -> [Float] {
    if let given { return given.map { shiftSigma(Float($0), shift) } + [0] }
    let tiny = 1.0 / Double(numTrainTimesteps)
    let sigmaMin = shift * tiny / (1 + (shift - 1) * tiny)  // float64, as np.float64 input
    var sigmas = [Float]()
    for i in 0..<n {  // np.linspace(1.0, sigma_min, n): i * step + start, the last exact
        let value = n == 1 ? 1.0
            : (i == n - 1 ? sigmaMin : Double(i) * ((sigmaMin - 1.0) / Double(n - 1)) + 1.0)
        sigmas.append(shiftSigma(Float(value), shift))
    }
    return sigmas + [0]
}

/// FlowMatchEulerDiscreteScheduler.set_timesteps as LTXPipeline calls it (ltx_sigmas): the
/// float64 linspace(1, 1/N, N) (or the `given` levels) rounded to Float, the exponential time
/// shift e / (e + (1 / s - 1)) with e = Float(shift) = exp(mu), then (with a terminal) 1 - s
/// scaled so the last level is shiftTerminal, all in Float as NumPy computes them; a final 0.
/// A schedule whose last level is 1 (one step) keeps it (the stretch would divide 0 by 0).
func ltxSigmas(steps n: Int, shift: Double, shiftTerminal: Double?,
               given: [Double]? = nil) -> [Float] {
    let e = Float(shift)
    let levels = given ?? linspace(1.0, 1.0 / Double(n), n)
    var sigmas = levels.map { s -> Float in e / (e + (1 / Float(s) - 1)) }
    if let terminal = shiftTerminal, sigmas[n - 1] != 1 {
        // 1 - shiftTerminal in float64, then Float (diffusers' Python float against float32)
        let scale = (1 - sigmas[n - 1]) / Float(1 - terminal)
        sigmas = sigmas.map { 1 - (1 - $0) / scale }
    }
    return sigmas + [0]
}

/// edge/core/schedulers.py leap_tail_sigmas: `steps` steps from tFrom down to tMin, evenly spaced
/// before the shift (float64, as NumPy computes on float64), then 0; rounded to float32.
public func leapTail(from tFrom: Float, to tMin: Float, steps: Int, shift: Double) -> [Float] {
    func unshift(_ t: Double) -> Double { t / (shift - (shift - 1) * t) }
    let start = unshift(Double(tFrom)), stop = unshift(Double(tMin))
    var sigmas = [Float]()
    for i in 0..<steps {  // np.linspace(start, stop, steps): i * step + start, the last exact
        let even = steps == 1 ? start
            : (i == steps - 1 ? stop : Double(i) * ((stop - start) / Double(steps - 1)) + start)
        sigmas.append(Float(shift * even / (1 + (shift - 1) * even)))
    }
    return sigmas + [0]
}
