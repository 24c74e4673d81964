import Foundation

// A mirror of edge/schedulers.py's classes: one type per scheduler with one small interface
// (`Scheduler`), looked up by the manifest's `sampler.scheduler` name (`schedulers`,
// `scheduler(named:shift:numTrainTimesteps:)`). The sampler (Sampler.swift) asks a scheduler
// only for what this interface gives: the noise levels and model times of a step count, the
// solver that steps through them, and what a leap asks (the re-planned tail, the jump to
// t = 0). The flow-match Euler schedule and a leap's tail are computed here; UniPC's flow
// sigmas and its solver are in UniPC.swift. Float32 arithmetic as NumPy's, operation for
// operation: tests/fixtures/swift/schedulers.json (tests/swift_fixtures.py
// scheduler_cases) is replayed through the registry by name.
//
// Both take the model's velocity v = noise - x0 (x_t = (1 - t) x0 + t noise); `modelTimes`
// are what the transformer is told the time is, in [0, 1].

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

/// What the sampler asks of a scheduler (Scheduler in edge/schedulers.py). `name` is the
/// manifest's `sampler.scheduler`.
public protocol Scheduler {
    static var name: String { get }
    var name: String { get }
    var shift: Double { get }
    var numTrainTimesteps: Int { get }

    init(shift: Double, numTrainTimesteps: Int)

    /// The noise levels of `steps` steps (float32, 1 > ... > 0, steps + 1 values) and what
    /// the transformer is told the time of each is (steps values, in [0, 1]).
    func schedule(steps: Int) -> (sigmas: [Float], modelTimes: [Float])

    /// A leap's re-planned rest: `steps` steps from tFrom down to tMin spaced as this
    /// schedule spaces its own, then 0 (steps + 1 values); and their model times (steps).
    func tail(from tFrom: Float, min tMin: Float, steps: Int) -> (sigmas: [Float], modelTimes: [Float])

    /// One generation's stepping through `sigmas`, fresh.
    func solver(sigmas: [Float]) -> any Solver

    /// A one-step leap from `sigma` straight to the end: the clean sample the velocity
    /// predicts.
    func jump(x: Tensor, v: Tensor, sigma: Float) -> Tensor
}

extension Scheduler {
    public var name: String { Self.name }

    /// For a flow: x - sigma v (an Euler step to 0), as Python's `euler_step(x, v, sigma, 0)`.
    public func jump(x: Tensor, v: Tensor, sigma: Float) -> Tensor { eulerStep(x, v, sigma, 0) }
}

/// FlowMatchEulerDiscreteScheduler with a static shift (tiny-sora, LTX-Video): model times
/// are the sigmas.
public struct FlowEuler: Scheduler {
    public static let name = "flow_euler"
    public let shift: Double
    public let numTrainTimesteps: Int

    public init(shift: Double, numTrainTimesteps: Int) {
        self.shift = shift
        self.numTrainTimesteps = numTrainTimesteps
    }

    public func schedule(steps: Int) -> (sigmas: [Float], modelTimes: [Float]) {
        let sigmas = eulerSigmas(steps: steps, shift: shift, numTrainTimesteps: numTrainTimesteps)
        return (sigmas, Array(sigmas.dropLast()))
    }

    public func tail(from tFrom: Float, min tMin: Float, steps: Int) -> (sigmas: [Float], modelTimes: [Float]) {
        let sigmas = leapTail(from: tFrom, to: tMin, steps: steps, shift: shift)
        return (sigmas, Array(sigmas.dropLast()))
    }

    public func solver(sigmas: [Float]) -> any Solver { EulerSolver(sigmas: sigmas) }
}

/// UniPCMultistepScheduler as Wan 2.1 configures it (flow prediction, flow sigmas with
/// `flow_shift`, order 2, bh2; UniPC.swift): model times are whole training steps.
public struct FlowUniPC: Scheduler {
    public static let name = "flow_unipc"
    public let shift: Double
    public let numTrainTimesteps: Int

    public init(shift: Double, numTrainTimesteps: Int) {
        self.shift = shift
        self.numTrainTimesteps = numTrainTimesteps
    }

    public func schedule(steps: Int) -> (sigmas: [Float], modelTimes: [Float]) {
        (unipcSigmas(steps: steps, shift: shift, numTrainTimesteps: numTrainTimesteps),
         unipcModelTimes(steps: steps, shift: shift, numTrainTimesteps: numTrainTimesteps))
    }

    public func tail(from tFrom: Float, min tMin: Float, steps: Int) -> (sigmas: [Float], modelTimes: [Float]) {
        let sigmas = leapTail(from: tFrom, to: tMin, steps: steps, shift: shift)
        return (sigmas, wholeStepTimes(Array(sigmas.dropLast()), numTrainTimesteps: numTrainTimesteps))
    }

    public func solver(sigmas: [Float]) -> any Solver { UniPCFlow(sigmas: sigmas) }
}

/// The schedulers by name, in edge/schedulers.py's SCHEDULERS order.
public let schedulers: [(name: String, type: any Scheduler.Type)] =
    ([FlowEuler.self, FlowUniPC.self] as [any Scheduler.Type]).map { ($0.name, $0) }

/// The names of `schedulers`, in its order.
public let knownSchedulers = schedulers.map(\.name)

/// The scheduler a manifest's `sampler.scheduler` names (scheduler_for); an unknown name is
/// refused naming the known ones, with Python's message.
public func scheduler(named name: String, shift: Double, numTrainTimesteps: Int) throws -> any Scheduler {
    guard let type = schedulers.first(where: { $0.name == name })?.type else {
        throw SettingsError.invalid(
            "sampler setting scheduler=\(pythonRepr(name)): known: \(knownSchedulers.joined(separator: ", "))")
    }
    return type.init(shift: shift, numTrainTimesteps: numTrainTimesteps)
}

/// Flow-match Euler through `sigmas`: x + (sigma_next - sigma) v, float32.
public final class EulerSolver: Solver {
    public let sigmas: [Float]

    public init(sigmas: [Float]) { self.sigmas = sigmas }

    public func step(v: Tensor, i: Int, x: Tensor) -> Tensor { eulerStep(x, v, sigmas[i], sigmas[i + 1]) }
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
/// linspace from 1 to the (shifted) smallest training sigma, shifted once more in float32,
/// then a final 0.
func eulerSigmas(steps n: Int, shift: Double, numTrainTimesteps: Int) -> [Float] {
    let tiny = 1.0 / Double(numTrainTimesteps)
    let sigmaMin = shift * tiny / (1 + (shift - 1) * tiny)  // float64, as np.float64 input
    var sigmas = [Float]()
    for i in 0..<n {  // np.linspace(1.0, sigma_min, n): i * step + start, the last exact
        let value = n == 1 ? 1.0 : (i == n - 1 ? sigmaMin : Double(i) * ((sigmaMin - 1.0) / Double(n - 1)) + 1.0)
        sigmas.append(shiftSigma(Float(value), shift))
    }
    return sigmas + [0]
}

/// edge/schedulers.py leap_tail_sigmas: `steps` steps from tFrom down to tMin, evenly spaced
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
