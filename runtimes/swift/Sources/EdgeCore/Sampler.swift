import Foundation

// A line-by-line mirror of edge/core/sampler.py (the sampler loop of every scheduler:
// classifier-free guidance, Linear Proportional Leap, TDTM step switch, step cache). It asks the
// scheduler the settings name (Schedulers.swift, edge/core/schedulers.py) for the noise levels,
// model times, solver, a leap's tail and its jump, and tests no scheduler's name. Keep them in
// step: the XCTests replay tests/fixtures/sampler/*.json and tests/fixtures/swift/*.json, written
// by the Python implementation. Arithmetic follows NumPy's dtypes: latents and velocities in
// float32, cosines and the cache indicator in float64.

public enum SettingsError: Error, CustomStringConvertible {
    case invalid(String)
    case unknownKeys([String])

    public var description: String {
        switch self {
        case .invalid(let why): return why
        case .unknownKeys(let keys):
            return "unknown sampler setting(s): \(keys.joined(separator: ", "))"
        }
    }
}

/// The manifest's `sampler` object (fields of SamplerSettings in edge/core/sampler.py).
public struct SamplerSettings: Codable, Equatable {
    public var steps = 30
    public static let maxSteps = 10_000               // edge/core/options.py MAX_STEPS
    public static let maxTrainTimesteps = 1_000_000   // edge/core/options.py MAX_TRAIN_TIMESTEPS
    public static let maxGuidance = 1e4               // edge/core/options.py MAX_GUIDANCE
    public var guidance = 5.0
    public var dynamicGuidance = false   // CogVideoX's use_dynamic_cfg (cogvideox_ddim only)
    public var guidanceRescale = 0.0     // LTXPipeline's guidance_rescale, 0 (off) to 1
    public var shift = 3.0
    public var numTrainTimesteps = 1000
    public var scheduler = "flow_euler"   // a name of `schedulers` (Schedulers.swift)
    public var shiftTerminal: Double? = nil  // the last level before 0 (ltx_flow_euler); nil: none
    public var leap = false
    public var leapAfter: Int? = nil
    public var leapMinSteps = 15
    public var leapPatience = 3
    public var leapTol = 1e-3
    public var leapSteps = 1              // steps from the leap to t = 0 (1: straight there)
    public var mergeSteps = 0
    public var cacheThreshold = 0.0
    public var guidanceSteps: Int? = nil  // guidance cutoff: the first K calls guided; nil: all
    /// Given noise levels, one a step, falling in (0, 1], in place of the schedule's own
    /// spacing (as diffusers' set_timesteps(sigmas=...)); nil: the schedule's own.
    public var sigmas: [Double]? = nil

    public init() {}

    // decoded with .convertFromSnakeCase (ManifestReader.jsonDecoder): num_train_timesteps
    // arrives as numTrainTimesteps
    enum CodingKeys: String, CodingKey, CaseIterable {
        case steps, guidance, dynamicGuidance, guidanceRescale, shift, numTrainTimesteps, scheduler,
             shiftTerminal, leap, leapAfter
        case leapMinSteps, leapPatience, leapTol, leapSteps, mergeSteps, cacheThreshold,
             guidanceSteps, sigmas
    }

    private struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    /// Missing keys take the defaults; an unknown key is refused by name (as from_dict does).
    public init(from decoder: Decoder) throws {
        let known = Set(CodingKeys.allCases.map(\.rawValue))
        let unknown = try decoder.container(keyedBy: AnyKey.self).allKeys.map(\.stringValue)
            .filter { !known.contains($0) }
        if !unknown.isEmpty { throw SettingsError.unknownKeys(unknown.sorted()) }
        let c = try decoder.container(keyedBy: CodingKeys.self)
        steps = try c.decodeIfPresent(Int.self, forKey: .steps) ?? steps
        guidance = try c.decodeIfPresent(Double.self, forKey: .guidance) ?? guidance
        // absent (packages before it): the fixed scale
        dynamicGuidance = try c.decodeIfPresent(Bool.self, forKey: .dynamicGuidance)
            ?? dynamicGuidance
        // absent (packages before it): no rescale
        guidanceRescale = try c.decodeIfPresent(Double.self, forKey: .guidanceRescale)
            ?? guidanceRescale
        shift = try c.decodeIfPresent(Double.self, forKey: .shift) ?? shift
        numTrainTimesteps = try c.decodeIfPresent(Int.self, forKey: .numTrainTimesteps)
            ?? numTrainTimesteps
        scheduler = try c.decodeIfPresent(String.self, forKey: .scheduler) ?? scheduler
        // absent (packages before it) or null: no terminal stretch
        shiftTerminal = try c.decodeIfPresent(Double.self, forKey: .shiftTerminal)
        leap = try c.decodeIfPresent(Bool.self, forKey: .leap) ?? leap
        leapAfter = try c.decodeIfPresent(Int.self, forKey: .leapAfter)
        leapMinSteps = try c.decodeIfPresent(Int.self, forKey: .leapMinSteps) ?? leapMinSteps
        leapPatience = try c.decodeIfPresent(Int.self, forKey: .leapPatience) ?? leapPatience
        leapTol = try c.decodeIfPresent(Double.self, forKey: .leapTol) ?? leapTol
        leapSteps = try c.decodeIfPresent(Int.self, forKey: .leapSteps) ?? leapSteps
        mergeSteps = try c.decodeIfPresent(Int.self, forKey: .mergeSteps) ?? mergeSteps
        cacheThreshold = try c.decodeIfPresent(Double.self, forKey: .cacheThreshold)
            ?? cacheThreshold
        // absent (packages before it) or null: every call guided
        guidanceSteps = try c.decodeIfPresent(Int.self, forKey: .guidanceSteps)
        // absent (packages before it) or null: the schedule's own levels
        sigmas = try c.decodeIfPresent([Double].self, forKey: .sigmas)
        try validate()
    }

    public func validate() throws {
        func bad(_ name: String, _ value: Any, _ why: String) -> SettingsError {
            .invalid("sampler setting \(name)=\(value): \(why)")
        }
        // the registry's refusal (Schedulers.swift), the message SamplerSettings gives
        let named = try EdgeCore.scheduler(named: scheduler, shift: shift,
                                           numTrainTimesteps: numTrainTimesteps)
        if steps < 1 { throw bad("steps", steps, "must be at least 1") }
        // edge/core/options.py's bounds: a count from a file never sizes an allocation unchecked
        for (name, value, most) in [("steps", steps, Self.maxSteps),
                                    ("leap_steps", leapSteps, Self.maxSteps),
                                    ("num_train_timesteps", numTrainTimesteps,
                                     Self.maxTrainTimesteps)] where value > most {
            throw bad(name, value, "more than \(most)")
        }
        if dynamicGuidance && !type(of: named).takesDynamicGuidance {
            let takers = schedulers.filter { $0.type.takesDynamicGuidance }.map(\.name)
                .joined(separator: ", ")
            // "True": the value as Python's repr() writes it, for SamplerSettings' own message
            throw bad("dynamic_guidance", "True", "\(scheduler) steps through no training " +
                                                  "timesteps (only \(takers) does; CogVideoX's " +
                                                  "dynamic guidance is a function of them)")
        }
        if !(guidanceRescale >= 0 && guidanceRescale <= 1) {
            throw bad("guidance_rescale", guidanceRescale,
                      "must be a number from 0 (off) to 1 (the guided velocity wholly rescaled)")
        }
        if let terminal = shiftTerminal {
            if !(terminal > 0 && terminal < 1) {
                throw bad("shift_terminal", terminal, "must be a number between 0 and " +
                                                      "1 (the last noise level before " +
                                                      "0), or None for no stretch")
            }
            if !type(of: named).takesShiftTerminal {
                let takers = schedulers.filter { $0.type.takesShiftTerminal }.map(\.name)
                    .joined(separator: ", ")
                throw bad("shift_terminal", terminal, "\(scheduler) takes none (only \(takers) " +
                                                      "stretches its schedule to a terminal level)")
            }
        }
        // a leap after steps - 1 or more steps never happens, so a package's fixed leap stays valid
        if let after = leapAfter, after < 1 { throw bad("leap_after", after, "must be at least 1") }
        if leapMinSteps < 1 { throw bad("leap_min_steps", leapMinSteps, "must be at least 1") }
        if leapPatience < 1 { throw bad("leap_patience", leapPatience, "must be at least 1") }
        if leapTol < 0 { throw bad("leap_tol", leapTol, "must not be negative") }
        if leapSteps < 1 { throw bad("leap_steps", leapSteps, "must be at least 1") }
        if leapSteps > 1 && !named.leapTail {  // a leap without a re-planned tail is one jump
            throw bad("leap_steps", leapSteps, "\(scheduler) leaps in one step only " +
                                               "(no re-planned tail is built for it)")
        }
        if mergeSteps < 0 { throw bad("merge_steps", mergeSteps, "must not be negative") }
        if cacheThreshold < 0 {
            throw bad("cache_threshold", cacheThreshold, "must not be negative")
        }
        if let k = guidanceSteps, !(0...steps).contains(k) {
            throw bad("guidance_steps", k, "must be a whole number from 0 to steps " +
                                           "(\(steps)), or None to guide every call")
        }
        if let levels = sigmas {
            try validateSigmas(levels, takes: type(of: named).takesSigmas, bad)
        }
        if !guidance.isFinite { throw bad("guidance", guidance, "must be a finite number") }
        if abs(guidance) > Self.maxGuidance {
            throw bad("guidance", guidance, "larger than 10000 in size (far above any useful " +
                                            "scale)")
        }
        try validateSchedule()
    }

    /// edge/core/options.py check_settings: the schedule falls from 1 to 0, finite and
    /// distinct (a shift of 1e-300 or one training timestep makes none: a NaN video).
    private func validateSchedule() throws {
        if !(shift.isFinite && shift > 0) {
            throw SettingsError.invalid("sampler setting shift=\(shift): must be positive")
        }
        let levels = timesteps(self)
        let falls = levels.allSatisfy(\.isFinite)
            && zip(levels, levels.dropFirst()).allSatisfy { $1 < $0 }
        if falls { return }
        if let given = sigmas {
            throw SettingsError.invalid("sampler setting sigmas=\(given): no usable noise " +
                                        "schedule (the levels, shifted, must fall, finite " +
                                        "and distinct)")
        }
        let terminal = shiftTerminal.map { ", shift_terminal=\($0)" } ?? ""
        throw SettingsError.invalid("sampler settings shift=\(shift), num_train_timesteps=" +
                                    "\(numTrainTimesteps)\(terminal): no usable noise schedule " +
                                    "(its levels must fall from 1 to 0, finite and distinct)")
    }

    /// Python's SamplerSettings._check_sigmas: one level a step, finite, in (0, 1], falling.
    private func validateSigmas(_ levels: [Double], takes: Bool,
                                _ bad: (String, Any, String) -> SettingsError) throws {
        if !takes {
            let takers = schedulers.filter { $0.type.takesSigmas }.map(\.name)
                .joined(separator: ", ")
            throw bad("sigmas", levels, "\(scheduler) takes no given levels (its diffusers " +
                                        "scheduler takes none either; \(takers) do)")
        }
        if !levels.allSatisfy(\.isFinite) {
            throw bad("sigmas", levels, "must be a list of finite numbers, " +
                                        "or None for the schedule's own levels")
        }
        if levels.count != steps {
            throw bad("sigmas", levels, "\(levels.count) levels for " +
                                        "steps=\(steps) (one level a step)")
        }
        if let outside = levels.first(where: { !($0 > 0 && $0 <= 1) }) {
            throw bad("sigmas", levels, "\(outside) is outside the schedule's range (0, 1]")
        }
        if let rise = levels.indices.dropFirst().first(where: { levels[$0] >= levels[$0 - 1] }) {
            throw bad("sigmas", levels, "does not fall: level \(rise) (\(levels[rise])) is " +
                                        "not below level \(rise - 1) (\(levels[rise - 1]))")
        }
    }
}

/// A string as Python's repr() writes it (for messages shaped as SamplerSettings' are): in
/// single quotes, or double ones when it holds a single quote and no double one.
func pythonRepr(_ text: String) -> String {
    let quote = text.contains("'") && !text.contains("\"") ? "\"" : "'"
    var out = quote
    for c in text.unicodeScalars {
        switch c {
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case _ where String(c) == quote: out += "\\" + quote
        default: out.unicodeScalars.append(c)
        }
    }
    return out + quote
}

/// The scheduler the settings name (scheduler_of in edge/core/sampler.py), with their shift and
/// training steps. Settings are validated when decoded and by `validate()` (as Python's
/// SamplerSettings are when made): an unknown name here is a caller's error, and stops the
/// program with the message `validate()` throws.
public func scheduler(of settings: SamplerSettings) -> any Scheduler {
    do {
        return try scheduler(named: settings.scheduler, shift: settings.shift,
                             numTrainTimesteps: settings.numTrainTimesteps,
                             shiftTerminal: settings.shiftTerminal)
    } catch {
        preconditionFailure("\(error)")
    }
}

/// The noise levels t_0 = 1 > ... > t_{N-1} > t_N = 0 (float32, steps + 1 values), as the
/// settings' diffusers scheduler sets them.
public func timesteps(_ settings: SamplerSettings) -> [Float] {
    scheduler(of: settings).schedule(steps: settings.steps, given: settings.sigmas).sigmas
}

/// What the transformer is told the time of each step is (steps values): the sigmas for
/// flow-match Euler; UniPC's whole training timesteps as fractions.
public func modelTimes(_ settings: SamplerSettings) -> [Float] {
    scheduler(of: settings).schedule(steps: settings.steps, given: settings.sigmas).modelTimes
}

public func guidedVelocity(_ cond: Tensor, _ uncond: Tensor, _ guidance: Double) -> Tensor {
    let g = Float(guidance)
    return Tensor(shape: cond.shape,
                  data: zip(cond.data, uncond.data).map { c, u in u + g * (c - u) })
}

/// edge/core/sampler.py rescaled_guidance (LTXPipeline's guidance_rescale): each sample of `v`
/// scaled to the standard deviation of its conditional velocity (over all its values, with
/// Bessel's correction as torch.std), mixed with `v` by `rescale`, in float64 then float32.
/// Sums run in order where NumPy's are pairwise: the same to float32 rounding, not bit for bit.
public func rescaledGuidance(_ v: Tensor, _ cond: Tensor, _ rescale: Double) -> Tensor {
    func besselStd(_ values: ArraySlice<Float>) -> Double {
        let mean = values.reduce(0.0) { $0 + Double($1) } / Double(values.count)
        let squares = values.reduce(0.0) { let d = Double($1) - mean; return $0 + d * d }
        return (squares / Double(values.count - 1)).squareRoot()
    }
    let n = v.count / v.shape[0]
    var out = [Float](repeating: 0, count: v.count)
    for b in 0..<v.shape[0] {
        let part = b * n..<(b + 1) * n
        let ratio = besselStd(cond.data[part]) / besselStd(v.data[part])
        for i in part {
            out[i] = Float(rescale * (Double(v.data[i]) * ratio)
                           + (1 - rescale) * Double(v.data[i]))
        }
    }
    return Tensor(shape: v.shape, data: out)
}

/// a * b exactly, as the pair p + e (Dekker's product: each factor split into halves of 26
/// bits, whose products are exact; no fused multiply-add, so sampler.js computes the same).
func twoProduct(_ a: Double, _ b: Double) -> (Double, Double) {
    func split(_ v: Double) -> (Double, Double) {
        let c = 134_217_729 * v, hi = c - (c - v)
        return (hi, v - hi)
    }
    let p = a * b
    let (ah, al) = split(a), (bh, bl) = split(b)
    return (p, ((ah * bh - p) + ah * bl + al * bh) + al * bl)
}

/// x ** 5 correctly rounded, which is Python's `x ** 5.0` (glibc's pow) on every pair the
/// fixtures hold, whatever this platform's pow gives: `dynamicGuidance`'s cosine of a huge
/// power hangs on its last bits. x^2 exactly, x^4 and x^5 with their small parts carried
/// (~2^-100 relative), then one rounding (sampler.js fifthPower). Odd in x, as Python's ** is
/// for a negative base.
public func fifthPower(_ x: Double) -> Double {
    let (s, se) = twoProduct(x, x)
    let (q, qe) = twoProduct(s, s)
    let fourthError = qe + (2 * s * se + se * se)
    let (r, re) = twoProduct(q, x)
    return r + (re + fourthError * x)
}

/// CogVideoXPipeline's use_dynamic_cfg scale at training timestep `timestep` of a
/// `steps`-step run, in float64 as diffusers computes it (dynamic_guidance in
/// edge/core/sampler.py).
public func dynamicGuidance(_ guidance: Double, timestep: Int, steps: Int) -> Double {
    1 + guidance * ((1 - cos(Double.pi * fifthPower(Double(steps - timestep) / Double(steps)))) / 2)
}

/// `guidance`, or CogVideoX's scale at the step's level (a training timestep) with
/// dynamicGuidance and a guidance over 1 (diffusers runs no guidance at or below 1):
/// step_guidance in edge/core/sampler.py.
/// edge/core/sampler.py guided_call: whether call `call` (0-based) is guided: a scale over 1 (as
/// diffusers' do_classifier_free_guidance) and the call before the cutoff (guidanceSteps).
public func guidedCall(_ settings: SamplerSettings, _ call: Int) -> Bool {
    settings.guidance > 1 && (settings.guidanceSteps.map { call < $0 } ?? true)
}

public func stepGuidance(_ settings: SamplerSettings, level: Float, steps: Int) -> Double {
    if settings.dynamicGuidance && settings.guidance > 1 {
        return dynamicGuidance(settings.guidance, timestep: Int(level), steps: steps)
    }
    return settings.guidance
}

/// Cosine similarity over the whole arrays, in float64.
public func cosine(_ a: Tensor, _ b: Tensor) -> Double {
    var dot = 0.0, na = 0.0, nb = 0.0
    for (p, q) in zip(a.data, b.data) {
        let x = Double(p), y = Double(q)
        dot += x * y; na += x * x; nb += y * y
    }
    let denom = na.squareRoot() * nb.squareRoot()
    return denom > 0 ? dot / denom : 1.0
}

/// Decides, after each velocity prediction, whether to leap to t = 0 now (see LeapRule in
/// edge/core/sampler.py).
public final class LeapRule {
    let settings: SamplerSettings
    var previous: Tensor?
    var best = -Double.infinity
    var stale = 0
    public private(set) var cosines: [Double] = []

    public init(_ settings: SamplerSettings) { self.settings = settings }

    public func shouldLeap(_ v: Tensor, stepsDone: Int) -> Bool {
        let s = settings
        if let previous {
            let c = cosine(v, previous)
            cosines.append(c)
            if c > best + s.leapTol { best = c; stale = 0 } else { stale += 1 }
        }
        previous = v
        if !s.leap || stepsDone >= s.steps - 1 { return false }
        if let after = s.leapAfter { return stepsDone >= after }
        return stepsDone >= s.leapMinSteps && stale >= s.leapPatience
    }
}

/// The first block's timestep-modulated input from the prologue's outputs x (B, T, S, D) and
/// t_mod (B, 6, D): LayerNorm over D (eps 1e-6, no affine) * (1 + t_mod[:, 1]) + t_mod[:, 0],
/// in float64 but for 1 + t_mod[:, 1] (float32, as NumPy computes it). Returned flat in x's order.
public func modulatedInput(_ x: Tensor, _ tMod: Tensor, eps: Double = 1e-6) -> [Double] {
    let d = x.shape[x.shape.count - 1], perItem = x.count / x.shape[0]
    var out = [Double](repeating: 0, count: x.count)
    for start in stride(from: 0, to: x.count, by: d) {
        let row = x.data[start..<(start + d)].map(Double.init)
        let mean = row.reduce(0, +) / Double(d)
        let variance = row.reduce(0) { $0 + ($1 - mean) * ($1 - mean) } / Double(d)
        let norm = (variance + eps).squareRoot()
        let b = start / perItem
        for j in 0..<d {
            // 1 + scale in float32, as NumPy adds a Python float to a float32 array
            let scale = Double(1 + tMod.data[(b * 6 + 1) * d + j]),
                shift = Double(tMod.data[b * 6 * d + j])
            out[start + j] = (row[j] - mean) / norm * scale + shift
        }
    }
    return out
}

/// mean |a - b| / mean |b|.
public func relativeL1(_ a: [Double], _ b: [Double]) -> Double {
    var diff = 0.0, base = 0.0
    for (x, y) in zip(a, b) { diff += abs(x - y); base += abs(y) }
    return base > 0 ? (diff / Double(a.count)) / (base / Double(b.count)) : .infinity
}

/// TeaCache-style reuse of the transformer pairs' residual across steps (StepCache).
public final class StepCache {
    public let threshold: Double
    var previous: [Double]?
    var accumulated = 0.0
    var residual: Tensor?
    var residualBatch: Int?

    public init(threshold: Double) { self.threshold = threshold }

    /// `batch`: the indicator's leading size (the guidance batch).
    public func shouldCompute(_ indicator: [Double], batch: Int, force: Bool = false) -> Bool {
        let change = previous.map { relativeL1(indicator, $0) } ?? .infinity
        previous = indicator
        // a residual of fewer rows than the call's batch cannot stand in (edge/core/sampler.py)
        if force || residual == nil || (residualBatch ?? 0) < batch {
            accumulated = 0
            return true
        }
        accumulated += change
        if accumulated < threshold { return false }
        accumulated = 0
        return true
    }

    public func store(before: Tensor, after: Tensor) {
        residual = Tensor(shape: after.shape, data: zip(after.data, before.data).map { $0 - $1 })
        residualBatch = before.shape[0]
    }

    public func reuse(_ before: Tensor) -> Tensor {
        Tensor(shape: before.shape, data: zip(before.data, residual!.data).map { $0 + $1 })
    }
}

/// What the sampler tells the predictor about one transformer call.
public final class Step {
    public let index: Int
    public let merged: Bool      // run the TDTM variants of the pairs
    public let cache: StepCache?
    public let last: Bool
    public var computed = true   // set by runPairs: false when the cache stood in
    // predict the unconditional velocity too (guidance); false: the conditional one alone
    public let guided: Bool
    public let videos: Int       // the videos generated: the first rows of a call's batch (0: all)

    public init(index: Int, merged: Bool, cache: StepCache?, last: Bool, guided: Bool = true,
                videos: Int = 0) {
        self.index = index; self.merged = merged; self.cache = cache; self.last = last
        self.guided = guided; self.videos = videos
    }
}

/// Run the transformer pairs on tokens x, or reuse the cached residual.
public func runPairs(_ step: Step, x: Tensor, tMod: Tensor,
                     pairs: (Tensor) throws -> Tensor) rethrows -> (Tensor, Bool) {
    guard let cache = step.cache else { return (try pairs(x), true) }
    // the indicator of the caption half: the first `videos` rows (the null half's are the same)
    let rows = step.videos > 0 ? min(step.videos, x.shape[0]) : x.shape[0]
    let indicator = modulatedInput(x.slice(axis: 0, 0..<rows), tMod.slice(axis: 0, 0..<rows))
    if cache.shouldCompute(indicator, batch: x.shape[0], force: step.index == 0 || step.last) {
        let out = try pairs(x)
        cache.store(before: x, after: out)
        return (out, true)
    }
    step.computed = false
    return (cache.reuse(x), false)
}

/// What one `sample` call did.
public struct Trace: Equatable {
    public var calls = 0
    public var transformerCalls = 0
    public var leapAt: Int? = nil
    public var cosines: [Double] = []
    public var mergedCalls = 0
    public var guidedCalls = 0   // with the unconditional half (guidance) run

    public init() {}
}

/// predict(latents, t, step) -> (v_cond, v_uncond); v_uncond nil where the step is unguided
public typealias Predictor = (Tensor, Float, Step) throws -> (Tensor, Tensor?)

/// Integrate from t = 1 (noise) to t = 0; returns the final latents. The predictor is told
/// the model time of each step (the schedule's). After a leap the loop goes on over the
/// leap's tail (its own noise levels and model times, a fresh solver) until t = 0.
public func sample(predict: Predictor, noise: Tensor, settings: SamplerSettings,
                   onStep: ((Int, Int) -> Void)? = nil, trace: inout Trace) rethrows -> Tensor {
    let scheduler = EdgeCore.scheduler(of: settings)
    var (ts, modelTs) = scheduler.schedule(steps: settings.steps, given: settings.sigmas)
    var solver = scheduler.solver(sigmas: ts)
    var x = noise
    let rule = LeapRule(settings)
    let cache = settings.cacheThreshold > 0 ? StepCache(threshold: settings.cacheThreshold) : nil
    var lastCall = settings.steps - 1
    if settings.leap, let after = settings.leapAfter, after < settings.steps - 1 {
        lastCall = after + settings.leapSteps - 1  // a fixed leap's tail ends the run
    }
    var total = settings.steps
    var call = 0, i = 0
    while i < ts.count - 1 {
        let step = Step(index: call, merged: call < settings.mergeSteps, cache: cache,
                        last: call == lastCall,
                        guided: guidedCall(settings, call), videos: noise.shape[0])
        let (cond, uncond) = try predict(x, modelTs[i], step)
        trace.calls += 1
        trace.transformerCalls += step.computed ? 1 : 0
        trace.mergedCalls += step.merged ? 1 : 0
        trace.guidedCalls += step.guided ? 1 : 0
        var v = cond
        if step.guided {
            guard let uncond else {
                preconditionFailure("call \(call) is guided, and its " +
                                    "predictor gave no unconditional velocity")
            }
            // the step count of the schedule being run: `steps` with dynamic guidance, whose
            // scheduler never re-plans a tail; a leap's jump is guided as the step it replaces
            v = guidedVelocity(cond, uncond,
                               stepGuidance(settings, level: ts[i], steps: ts.count - 1))
            if settings.guidanceRescale > 0 {
                v = rescaledGuidance(v, cond, settings.guidanceRescale)
            }
        }
        if trace.leapAt == nil && rule.shouldLeap(v, stepsDone: call) {
            trace.leapAt = call
            if settings.leapSteps == 1 {  // the whole remaining time in one step
                x = scheduler.jump(x: x, v: v, sigma: ts[i])
                call += 1
                total = call
                onStep?(total, total)
                break
            }
            (ts, modelTs) = scheduler.tail(from: ts[i], min: ts[ts.count - 2],
                                           steps: settings.leapSteps)
            solver = scheduler.solver(sigmas: ts)
            i = 0
            lastCall = call + settings.leapSteps - 1
            total = call + settings.leapSteps
        }
        x = solver.step(v: v, i: i, x: x)
        i += 1
        call += 1
        onStep?(call, total)
    }
    trace.cosines = rule.cosines
    return x
}
