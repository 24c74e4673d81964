import EdgeCore
import EdgeDemoKit
@testable import EdgeRuntime
import Foundation
import XCTest

/// Seeds in the pipeline: a seed draws torch.randn's noise for it (TorchNoise); a package
/// whose manifest defines seeds otherwise (no `noise` field: NumPy PCG64 noise) refuses a
/// seed but runs given latents; a seed and latents together are refused. On the replay
/// fixtures' tiny-sora package, its blocks answering zeros (ZeroBackend).
final class SeedTests: ScratchTestCase {
    /// Two steps are enough: the sampler's and the decoder's calls all run.
    let twoSteps: (inout SamplerSettings) -> Void = { $0.steps = 2 }

    /// A private copy of the replay package with its manifest's `noise` field set to
    /// `noise` (nil: removed, as in a package written before the field).
    func package(noise: String?) throws -> URL {
        let copy = scratch.appendingPathComponent("package")
        try FileManager.default.copyItem(at: try ReplayFixtures.load().package, to: copy)
        let url = copy.appendingPathComponent("manifest.json")
        var body = try XCTUnwrap(
            JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any])
        body["noise"] = noise
        try JSONSerialization.data(withJSONObject: body).write(to: url)
        return copy
    }

    func testASeedDrawsTorchsNoiseForIt() throws {
        let pipe = try Pipeline(package: try ReplayFixtures.load().package,
                                    backend: ZeroBackend())
        XCTAssertEqual(pipe.manifest.noise, TorchNoise.definition, "the exporter writes the " +
            "noise field")
        let shape = [1] + pipe.manifest.latentShape
        let seeded = try pipe.generate("a red circle", seed: 3, configure: twoSteps)
        XCTAssertEqual(seeded.noise, try TorchNoise.randn(shape: shape, seed: 3))
        // no seed and no latents: seed 0; a seed's low 32 bits are the engine's (2^32 + 7 is 7)
        XCTAssertEqual(try pipe.generate("a red circle", configure: twoSteps).noise,
                       try TorchNoise.randn(shape: shape, seed: 0))
        XCTAssertEqual(
            try pipe.generate("a red circle", seed: (1 << 32) + 7, configure: twoSteps).noise,
                       try pipe.generate("a red circle", seed: 7, configure: twoSteps).noise)
        let given = Tensor(shape: shape, data: (0..<shape.reduce(1, *)).map { Float($0 % 7) / 7 })
        XCTAssertEqual(try pipe.generate("a red circle", latents: given, configure: twoSteps).noise,
                       given)
    }

    func testRefusesASeedOutOfRangeBeforeAnyBlockRuns() throws {
        let backend = LoadCountingBackend()
        let pipe = try Pipeline(package: try ReplayFixtures.load().package, backend: backend)
        for seed in [TorchNoise.maxSeed + 1, UInt64.max] {
            try assertRefused("seed \(seed)", ["seed \(seed)", "out of range", "2^63 - 1"]) {
                _ = try pipe.generate("a red circle", seed: seed, configure: twoSteps)
            }
        }
        XCTAssertEqual(backend.loads, 0, "nothing ran for a refused seed")
    }

    func testRefusesASeedAndLatentsTogether() throws {
        let pipe = try Pipeline(package: try ReplayFixtures.load().package,
                                    backend: ZeroBackend())
        let latents = Tensor(zeros: [1] + pipe.manifest.latentShape)
        for seed: UInt64 in [0, 5] {
            try assertRefused("seed \(seed) and latents",
                              ["seed and latents given together", "give one"]) {
                _ = try pipe.generate("a red circle", seed: seed, latents: latents,
                                      configure: twoSteps)
            }
        }
    }

    /// A package written before the `noise` field (its seeds meant NumPy PCG64 noise), or one
    /// naming that definition: a seed is refused (also the default seed 0), naming the
    /// manifest, the definition and the way out; given latents run.
    func testAPackageWithAnotherNoiseRefusesASeedButRunsWithLatents() throws {
        for noise in [nil, "numpy.pcg64"] as [String?] {
            try? FileManager.default.removeItem(at: scratch.appendingPathComponent("package"))
            let backend = LoadCountingBackend()
            let pipe = try Pipeline(package: try package(noise: noise), backend: backend)
            XCTAssertEqual(pipe.manifest.noise, noise)
            let words = ["manifest.json", "noise 'numpy.pcg64'", "torch.randn/cpu/float32",
                         "initial latents"]
            try assertRefused("noise \(noise ?? "absent"), seed 3", words) {
                _ = try pipe.generate("a red circle", seed: 3, configure: twoSteps)
            }
            try assertRefused("noise \(noise ?? "absent"), no seed", words) {
                _ = try pipe.generate("a red circle", configure: twoSteps)
            }
            XCTAssertEqual(backend.loads, 0, "nothing ran for a refused seed")
            let latents = try TorchNoise.randn(shape: [1] + pipe.manifest.latentShape, seed: 11)
            let result = try pipe.generate("a red circle", latents: latents, configure: twoSteps)
            XCTAssertEqual(result.noise, latents)
            XCTAssertEqual(result.frames.count, 16)
        }
    }

    /// The demo's seed (an Int in its form): a negative one is refused by name before a
    /// pipeline is made, not trapped on; a valid one is the pipeline's seed.
    func testTheDemoRefusesANegativeSeed() throws {
        let package = try ReplayFixtures.load().package
        let session = DemoSession { url, budget in
            try Pipeline(package: url, backend: ZeroBackend(), budget: budget)
        }
        var options = DemoOptions()
        options.seed = -1
        try assertRefused("demo seed -1", ["seed -1", "out of range", "2^63 - 1"]) {
            _ = try session.run(package: package, options: options)
        }
        XCTAssertEqual(session.pipelinesMade, 0)
        options.seed = 9
        let report = try session.run(package: package, options: options)
        XCTAssertEqual(report.result.noise,
                       try TorchNoise.randn(shape: report.result.noise.shape, seed: 9))
    }
}

/// ZeroBackend, counting the blocks it loads.
final class LoadCountingBackend: BlockBackend {
    private(set) var loads = 0
    func load(_ entry: BlockEntry) throws -> LoadedBlock {
        loads += 1
        return ZeroBlock(entry.block)
    }
}
