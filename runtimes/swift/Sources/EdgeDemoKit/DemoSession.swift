import EdgeCore
import EdgeRuntime
import Foundation

/// What the demo app's form asks for (ios_demo/EdgeDemo/ContentView.swift).
public struct DemoOptions: Equatable {
    public var prompt = "a red circle moving left"
    public var leap = false          // Linear Proportional Leap
    public var tdtm = false          // temporal token merging for the first half of the steps
    public var budgetMiB: Double?    // keep at most this many MiB (2^20 bytes) of blocks loaded
    public var seed = 0              // 0 to 2^63 - 1: torch.randn's noise for it (EdgeCore
                                     // TorchNoise)

    public init() {}

    public var budgetBytes: Int? { budgetMiB.map { Int($0 * 1_048_576) } }

    /// The package's sampler settings with the form's switches applied.
    public func configure(_ settings: inout SamplerSettings) {
        settings.leap = leap
        settings.mergeSteps = tdtm ? settings.steps / 2 : 0
    }
}

/// One finished generation, as the app shows it.
public struct DemoReport {
    public let result: Pipeline.Result
    public let rows: [(String, String)]   // timings and the sampler's counts, in order
}

/// The demo app's work without its UI, so it builds and is tested on Linux: keeps one pipeline
/// per (package, budget), reusing it across generations, and turns a result into the rows the
/// app lists. The app supplies how a pipeline is made (CoreML there; any backend in tests).
public final class DemoSession {
    public typealias PipelineMaker = (_ package: URL, _ budget: Int?) throws -> Pipeline

    let makePipeline: PipelineMaker
    private var pipeline: Pipeline?
    private var key: (URL, Int?)?
    public private(set) var pipelinesMade = 0

    public init(makePipeline: @escaping PipelineMaker) { self.makePipeline = makePipeline }

    /// Generate one video: the pipeline is made (verifying the package) only when the package
    /// or the budget changed. `onProgress` gets 0...1 after each step.
    public func run(package: URL, options: DemoOptions,
                    onProgress: @escaping (Double) -> Void = { _ in },
                    isCancelled: @escaping () -> Bool = { false }) throws -> DemoReport {
        // a negative one refused, not trapped on
        let seed = try TorchNoise.checkSeed(options.seed)
        let started = Date()
        if pipeline == nil || key?.0 != package || key?.1 != options.budgetBytes {
            pipeline = nil   // the old one's blocks are freed before the new one loads any
            pipeline = try makePipeline(package, options.budgetBytes)
            key = (package, options.budgetBytes)
            pipelinesMade += 1
        }
        let loadSeconds = Date().timeIntervalSince(started)
        let result = try pipeline!.generate(options.prompt, seed: seed,
                                            configure: options.configure,
                                            onStep: { done, total in
                                                onProgress(Double(done) / Double(total))
                                            },
                                            isCancelled: isCancelled)
        return DemoReport(result: result, rows: Self.rows(result, loadSeconds: loadSeconds))
    }

    /// Drop the pipeline and its loaded blocks (a memory warning).
    public func unload() { pipeline?.unload() }

    public static func rows(_ result: Pipeline.Result,
                            loadSeconds: Double) -> [(String, String)] {
        let seconds: [(String, Double)] = [("load + verify", loadSeconds)]
            + ["text_encoder", "transformer", "vae_decoder", "total", "block_load_s",
               "block_wait_s"]
            .compactMap { k in result.timings[k].map { (k, $0) } }
        let trace = result.trace
        return seconds.map { ($0.0, String(format: "%.2f s", $0.1)) } + [
            ("block loads", "\(Int(result.timings["block_loads"] ?? 0))"),
            ("transformer calls", "\(trace.transformerCalls) of \(trace.calls)"),
            ("merged (TDTM) calls", "\(trace.mergedCalls)"),
            ("leap", trace.leapAt.map { "after step \($0)" } ?? "no"),
        ]
    }
}

/// A cancel button's flag, set on the main thread and read by the generation's thread.
public final class CancellationFlag: @unchecked Sendable {   // the lock makes it safe
    private let lock = NSLock()
    private var value = false

    public init() {}

    public func cancel() { lock.lock(); value = true; lock.unlock() }
    public func reset() { lock.lock(); value = false; lock.unlock() }
    public var isCancelled: Bool { lock.lock(); defer { lock.unlock() }; return value }
}
