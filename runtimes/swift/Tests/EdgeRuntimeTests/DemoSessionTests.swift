import EdgeCore
import EdgeDemoKit
import EdgeRuntime
import Foundation
import XCTest

/// Answers every block call with zeros of the manifest's output shapes: enough to drive the
/// whole pipeline (verification, loader, sampler, decoding) without a model.
final class ZeroBackend: BlockBackend {
    func load(_ entry: BlockEntry) throws -> LoadedBlock { ZeroBlock(entry.block) }
}

final class ZeroBlock: LoadedBlock {
    let block: Manifest.Block
    init(_ block: Manifest.Block) { self.block = block }
    func predict(_ inputs: [String: Tensor]) throws -> [String: Tensor] {
        Dictionary(uniqueKeysWithValues: block.outputs.map { ($0.name, Tensor(zeros: $0.shape)) })
    }
}

/// The demo app's non-UI part (EdgeDemoKit) on the tiny-sora iphone package.
final class DemoSessionTests: XCTestCase {
    func testRunsReusesThePipelineAndReportsRows() throws {
        let package = try ReplayFixtures.load().package
        let session = DemoSession { url, budget in
            try Pipeline(package: url, backend: ZeroBackend(), budget: budget)
        }
        var options = DemoOptions()
        options.leap = false
        options.tdtm = true
        var progress: [Double] = []
        let first = try session.run(package: package, options: options,
                                    onProgress: { progress.append($0) })
        XCTAssertEqual(progress.last, 1.0)
        XCTAssertEqual(progress.count, 30, "one report per step of the package's 30")
        XCTAssertEqual(first.result.trace.mergedCalls, 15, "TDTM for the first half of the steps")
        XCTAssertEqual(first.result.frames.count, 16)
        let names = first.rows.map(\.0)
        XCTAssertEqual(Array(names.prefix(5)),
                       ["load + verify", "text_encoder", "transformer", "vae_decoder", "total"])
        XCTAssertEqual(first.rows.first { $0.0 == "merged (TDTM) calls" }?.1, "15")
        XCTAssertEqual(first.rows.first { $0.0 == "leap" }?.1, "no")

        options.tdtm = false
        _ = try session.run(package: package, options: options)
        XCTAssertEqual(session.pipelinesMade, 1, "same package and budget: the pipeline is reused")
        options.budgetMiB = 30
        let streamed = try session.run(package: package, options: options)
        XCTAssertEqual(session.pipelinesMade, 2, "a new budget makes a new pipeline")
        XCTAssertGreaterThan(streamed.result.timings["block_loads"] ?? 0, 20,
                             "a 30 MiB budget streams blocks")

        options.budgetMiB = 16   // below the text encoder's 22.4 MiB embeddings block
        XCTAssertThrowsError(try session.run(package: package, options: options)) { error in
            XCTAssertTrue("\(error)".contains("text_encoder/embeddings"), "\(error)")
        }
    }

    func testCancellationStopsTheRun() throws {
        let package = try ReplayFixtures.load().package
        let session = DemoSession { url, budget in
            try Pipeline(package: url, backend: ZeroBackend(), budget: budget)
        }
        var steps = 0
        let flag = CancellationFlag()
        XCTAssertThrowsError(try session.run(package: package, options: DemoOptions(),
                                             onProgress: { _ in
            steps += 1
            if steps == 2 { flag.cancel() }
        }, isCancelled: { flag.isCancelled })) { error in
            XCTAssertEqual(error as? RuntimeError, .cancelled)
        }
        XCTAssertEqual(steps, 2)
        flag.reset()
        XCTAssertFalse(flag.isCancelled)
        XCTAssertNoThrow(try session.run(package: package, options: DemoOptions()))
    }
}
