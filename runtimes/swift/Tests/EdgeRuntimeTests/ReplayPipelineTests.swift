import EdgeCore
@testable import EdgeRuntime
import Foundation
import XCTest

/// The Swift pipeline against the Python runtime's recorded block calls: the same calls with
/// the same inputs, in the same order, and the same frames, for each recorded setting.
final class ReplayPipelineTests: XCTestCase {
    func assertReproduces(_ pipe: Pipeline, _ player: ReplayPlayer, _ fx: ReplayFixtures,
                          _ c: ReplayFixtures.Case, file: StaticString = #filePath,
                          line: UInt = #line) throws {
        player.start(c)
        let result = try pipe.generate(c.prompt, latents: fx.tensor(c.latents),
                                       configure: fx.configure(c))
        XCTAssertTrue(player.finished, "\(c.name): Swift made \(player.next) " +
                                       "of Python's \(player.calls.count) " +
                                       "block calls", file: file, line: line)
        let want = fx.tensor(c.frames)   // (T, H, W, 3) uint8 values
        XCTAssertEqual([result.frames.count, result.height, result.width, 3], want.shape, c.name,
                       file: file, line: line)
        let got = result.frames.flatMap { $0 }.map(Float.init)
        let differing = zip(got, want.data).filter { $0 != $1 }.count
        XCTAssertEqual(differing, 0, "\(c.name): \(differing) frame bytes differ from " +
                                     "the Python runtime's", file: file, line: line)
        XCTAssertEqual(result.trace.calls, (c.trace["calls"] as! NSNumber).intValue,
                       "\(c.name) calls", file: file, line: line)
        XCTAssertEqual(result.trace.transformerCalls,
                       (c.trace["transformer_calls"] as! NSNumber).intValue,
                       "\(c.name) transformer calls", file: file, line: line)
        XCTAssertEqual(result.trace.mergedCalls, (c.trace["merged_calls"] as! NSNumber).intValue,
                       "\(c.name) merged calls", file: file, line: line)
        XCTAssertEqual(result.trace.leapAt, (c.trace["leap_at"] as? NSNumber)?.intValue,
                       "\(c.name) leap", file: file, line: line)
    }

    /// Every recorded case in order through one pipeline (two prompts, loader reused).
    func testEveryCaseReproducesThePythonRuntime() throws {
        let fx = try ReplayFixtures.load()
        XCTAssertEqual(fx.cases.map(\.name),
                       ["baseline", "leap", "leap_tail", "merge", "step_cache", "second_prompt"])
        let player = ReplayPlayer(fx)
        let pipe = try Pipeline(package: fx.package, backend: ReplayBackend(player))
        for c in fx.cases { try assertReproduces(pipe, player, fx, c) }
        XCTAssertLessThanOrEqual(player.worstInputError, 1e-5)
        print("replay: worst relative input difference from Python's \(player.worstInputError)")
    }

    /// Under a budget that streams most blocks the calls and frames are the same, and what is
    /// loaded never exceeds the budget.
    func testStreamingUnderABudgetReproducesThePythonRuntime() throws {
        let fx = try ReplayFixtures.load()
        let player = ReplayPlayer(fx)
        let backend = ReplayBackend(player)
        let largest = try Pipeline.entries(try manifest(fx), root: fx.package)
            .map(\.weightBytes).max()!
        let budget = largest + largest / 4
        let pipe = try Pipeline(package: fx.package, backend: backend, budget: budget)
        XCTAssertFalse(pipe.loader.pinned.contains("text_encoder/embeddings"))
        for c in fx.cases where c.name == "merge" || c.name == "step_cache" {
            try assertReproduces(pipe, player, fx, c)
        }
        XCTAssertLessThanOrEqual(pipe.loader.stats.peakBytes, budget)
        XCTAssertGreaterThan(pipe.loader.stats.unloads, 0, "nothing was streamed")
    }

    /// A generation cancelled mid-way throws `cancelled`; the same pipeline then reproduces the
    /// full run.
    func testCancelledGenerationLeavesThePipelineReusable() throws {
        let fx = try ReplayFixtures.load()
        let player = ReplayPlayer(fx)
        let largest = try Pipeline.entries(try manifest(fx), root: fx.package)
            .map(\.weightBytes).max()!
        let pipe = try Pipeline(package: fx.package, backend: ReplayBackend(player),
                                    budget: 2 * largest)
        let c = fx.cases[0]
        player.start(c)
        var steps = 0
        XCTAssertThrowsError(try pipe.generate(c.prompt, latents: fx.tensor(c.latents),
                                               configure: fx.configure(c),
                                               onStep: { _, _ in steps += 1 },
                                               isCancelled: { steps >= 3 })) { error in
            XCTAssertEqual(error as? RuntimeError, .cancelled)
        }
        XCTAssertEqual(steps, 3)
        XCTAssertLessThanOrEqual(pipe.loader.residentBytes, 2 * largest)
        try assertReproduces(pipe, player, fx, c)
    }

    /// `.latent` output runs no decoder block and gives the denoised latents, which decoded
    /// make the Python runtime's frames (the decoder's calls then replayed in order).
    func testLatentOutputRunsNoDecoderAndDecodesToTheSameFrames() throws {
        let fx = try ReplayFixtures.load()
        let player = ReplayPlayer(fx)
        let pipe = try Pipeline(package: fx.package, backend: ReplayBackend(player))
        let c = fx.cases[0]
        player.start(c)
        let result = try pipe.generate(c.prompt, latents: fx.tensor(c.latents),
                                       configure: fx.configure(c),
                                       outputType: .latent)
        XCTAssertTrue(result.frames.isEmpty)
        XCTAssertEqual(result.latents.shape, [1] + pipe.manifest.latentShape)
        XCTAssertFalse(player.finished)
        XCTAssertTrue(player.calls[player.next].key.hasPrefix("vae_decoder/"),
                      "the next call is \(player.calls[player.next].key)")
        XCTAssertTrue(player.calls[..<player.next].allSatisfy { !$0.key.hasPrefix("vae_decoder/") })
        let (frames, _, _) = try pipe.decode(result.latents,
                                             try pipe.manifest.component("vae_decoder"),
                                             conditioning: [:])
        XCTAssertTrue(player.finished, "decoding made \(player.next) " +
                                       "of \(player.calls.count) calls")
        let want = fx.tensor(c.frames)
        XCTAssertEqual(frames.flatMap { $0 }.map(Float.init), want.data,
                       "the decoded latents' frames differ")
    }

    func manifest(_ fx: ReplayFixtures) throws -> Manifest {
        try ManifestReader.decode(
            Data(contentsOf: fx.package.appendingPathComponent("manifest.json")))
    }
}
