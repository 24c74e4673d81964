import EdgeCore
@testable import EdgeRuntime
import Foundation
import XCTest

/// A Wan 2.1 package (tiny, random weights) through the Swift pipeline, held to `edge record`
/// bundles of it (tests/swift_replay.py write_wan): the Unigram tokenizer and Wan's prompt
/// cleaning, the negative prompt, UniPC, TDTM, the leap, the step cache, the chunked causal
/// decoder and the video latent layout must make every block call the Python side made,
/// with the same inputs, and the same frames. Bundles of another package, truncated or
/// changed ones, and ones whose calls are not this package's are refused by name.
final class BundleTests: ScratchTestCase {
    /// The folder tests/swift_replay.py fills.
    func replayFolder() throws -> URL {
        guard let path = ProcessInfo.processInfo.environment["EDGE_SWIFT_REPLAY"] else {
            throw XCTSkip("EDGE_SWIFT_REPLAY is not set: `pytest " +
                          "tests/test_swift_runtime.py` records the bundles (they " +
                          "need the Python side) and runs these tests with them")
        }
        return URL(fileURLWithPath: path)
    }

    func wanFolder() throws -> URL { try replayFolder().appendingPathComponent("wan") }

    func bundle(_ name: String) throws -> ConformanceBundle {
        try ConformanceBundle(
            contentsOf: wanFolder().appendingPathComponent("bundles").appendingPathComponent(name))
    }

    /// `b` replayed through the Swift pipeline of `package`: every recorded call made, with
    /// inputs within 1e-5 of the recording's, the same frames and trace.
    func replayed(_ b: ConformanceBundle, on package: URL, _ what: String,
                  file: StaticString = #filePath, line: UInt = #line)
        throws -> (BundleReplay, BundleReport, Pipeline) {
        let replay = BundleReplay(b)
        let pipe = try Pipeline(package: package, backend: replay)
        let report = try pipe.run(b)
        XCTAssertTrue(replay.finished, "\(what): Swift made \(replay.next) " +
                                       "of \(b.calls.count) calls",
                      file: file, line: line)
        XCTAssertEqual(report.frameBytesDiffering, 0, "\(what): frame bytes differ",
                       file: file, line: line)
        let trace = report.frames!.trace
        XCTAssertEqual(ConformanceBundle.Trace(calls: trace.calls,
                                               transformerCalls: trace.transformerCalls,
                                               mergedCalls: trace.mergedCalls,
                                               leapAt: trace.leapAt),
                       b.trace, what, file: file, line: line)
        XCTAssertLessThanOrEqual(replay.worstInputDifference, 1e-5, what, file: file, line: line)
        return (replay, report, pipe)
    }

    func testEveryWanBundleReplaysWithTheSameCallsAndFrames() throws {
        let package = try wanFolder().appendingPathComponent("package")
        for name in ["seed", "negative_merge_leap", "step_cache", "guidance_cutoff"] {
            let b = try bundle(name)
            let (replay, report, _) = try replayed(b, on: package, name)
            if name == "guidance_cutoff" {
                // guided for the first 2 calls; the rest run the caption's half alone through
                // the blocks' caption-half functions (merged ones on the TDTM pairs), the
                // calls the Python runtime made (replayed: same keys, same batch-one inputs)
                XCTAssertEqual((b.settings["guidance_steps"] as? NSNumber)?.intValue, 2)
                XCTAssertEqual(report.frames!.trace.guidedCalls, 2, name)
                let variants = Set(b.calls.compactMap {
                    $0.key.split(separator: "#").dropFirst().first.map(String.init)
                })
                XCTAssertEqual(variants, ["tdtm", "unguided", "tdtm_unguided", "first"], name)
                let halves = b.calls.filter {
                    $0.key.hasSuffix("#unguided") && $0.inputs["latent"] != nil
                }
                XCTAssertFalse(halves.isEmpty, name)
                XCTAssertTrue(halves.allSatisfy { $0.inputs["latent"]!.shape[0] == 1 }, name)
            }
            // recorded from a seed: the Swift pipeline drew that seed's noise (TorchNoise),
            // the recorded latents within 1e-5
            XCTAssertNotNil(b.seed, name)
            let drift = try XCTUnwrap(report.seedLatentsDifference, name)
            XCTAssertLessThanOrEqual(drift, 1e-5, name)
            XCTAssertEqual(report.frames!.noise,
                           try TorchNoise.randn(shape: b.latents.shape, seed: b.seed!), name)
            print("bundle \(name): \(b.calls.count) calls, worst relative input " +
                  "difference \(replay.worstInputDifference); latents drawn for " +
                  "seed \(b.seed!) within \(drift) of the recorded ones")
        }
        XCTAssertEqual(try bundle("seed").seed, 0)
        XCTAssertEqual(try bundle("step_cache").seed, 5)
        // what the settings exercised: merging, a leap, skipped transformer calls
        XCTAssertGreaterThan(try bundle("negative_merge_leap").trace.mergedCalls, 0)
        XCTAssertNotNil(try bundle("negative_merge_leap").trace.leapAt)
        let cached = try bundle("step_cache").trace
        XCTAssertLessThan(cached.transformerCalls, cached.calls)
    }

    /// tiny-sora's Core AI package (`--min-ios 27`, the layout whose programs run on Linux):
    /// a bundle recorded from the programs Core AI's runtime executed replays in the Swift
    /// pipeline with the same calls and frames — merged first steps through the pairs'
    /// `tdtm` functions, then after the guidance cutoff the caption's half alone through the
    /// `unguided` and `tdtm_unguided` functions, at a batch of one.
    func testACoreAIBundleReplaysOnItsPackage() throws {
        let folder = try replayFolder().appendingPathComponent("coreai")
        let package = folder.appendingPathComponent("package")
        let b = try ConformanceBundle(contentsOf: folder.appendingPathComponent("bundles")
            .appendingPathComponent("merge_cutoff"))
        XCTAssertTrue(b.recordedWith.hasPrefix("coreai"), b.recordedWith)
        let (replay, report, pipe) = try replayed(b, on: package, "coreai merge_cutoff")
        XCTAssertEqual(pipe.manifest.coreml.layout, "coreai")
        XCTAssertEqual(report.frames!.trace.guidedCalls, 1)
        let keys = b.calls.map(\.key)
        XCTAssertTrue(keys.contains { $0.hasSuffix("#tdtm") }
                      && keys.contains { $0.hasSuffix("#tdtm_unguided") }
                      && keys.contains { $0.hasSuffix("#unguided") }, "\(Set(keys))")
        let halves = b.calls.filter { $0.key.hasSuffix("unguided") }
        XCTAssertTrue(halves.allSatisfy { $0.inputs.values.allSatisfy { $0.shape.first == 1 } },
                      "caption-half calls at a batch of one")
        print("bundle coreai_merge_cutoff: \(b.calls.count) calls, worst relative input " +
              "difference \(replay.worstInputDifference)")

        // the layout picks the framework; a backend refuses the other one's programs by name
        XCTAssertEqual(ProgramRuntime.of(pipe.manifest), .coreAI)
        let aimodel = try Pipeline.entries(pipe.manifest, root: package)[0]
        XCTAssertNoThrow(try ProgramRuntime.coreAI.check(aimodel))
        try checkTruncatedProgramsAreRefused(pipe.manifest, package)
        XCTAssertThrowsError(try ProgramRuntime.coreML.check(aimodel)) {
            XCTAssertTrue("\($0)".contains("is a Core AI program (layout coreai (--min-ios 27)); " +
                                           "the Core ML backend runs .mlpackage programs only"),
                          "\($0)")
        }
        let wan = try Pipeline(package: wanFolder().appendingPathComponent("package"),
                                   backend: BundleReplay(try bundle("seed")))
        XCTAssertEqual(ProgramRuntime.of(wan.manifest), .coreML)
        XCTAssertThrowsError(try ProgramRuntime.coreAI.check(
            try Pipeline.entries(wan.manifest, root: wan.root)[0])) {
            XCTAssertTrue("\($0)".contains("is a Core ML program (layout " +
                                           "separate or multifunction"),
                          "\($0)")
        }
        #if !canImport(CoreAI)
        // Linux: no Core AI framework
        XCTAssertThrowsError(try Pipeline.coreAIBackend(pipe.manifest)) {
            XCTAssertTrue(
                "\($0)".contains("its layout is coreai") && "\($0)".contains("--min-ios 18"),
                          "\($0)")
        }
        #endif
    }

    /// The tiny Wan whose VAE tiles its 4 x 6 latents (4 x 4 tiles, a stride of 2 across),
    /// as a Core AI package: the Swift pipeline decodes tile by tile, each tile through its
    /// size's functions (`tile_4x2`, `first_tile_4x2` where the tile is 4 x 2), making the
    /// calls the Python runtime made, and blends them into the same frames.
    func testATiledDecoderBundleReplaysTileByTile() throws {
        let folder = try replayFolder().appendingPathComponent("tiled")
        let b = try ConformanceBundle(contentsOf: folder.appendingPathComponent("bundles")
            .appendingPathComponent("tiles"))
        let (replay, _, pipe) = try replayed(b, on: folder.appendingPathComponent("package"),
                                             "tiled tiles")
        let tiling = try XCTUnwrap(pipe.manifest.component("vae_decoder").tiles)
        XCTAssertEqual(tiling.tileSizes(height: 4, width: 6), [[4, 4], [4, 2]])
        let head = b.calls.map(\.key).filter { $0.hasPrefix("vae_decoder/head") }
        // 3 tiles of 3 latent frames: the first frame's, then two later ones, per tile
        XCTAssertEqual(head, ["#first", "", "", "#first", "", "", "#first_tile_4x2",
                              "#tile_4x2", "#tile_4x2"].map { "vae_decoder/head\($0)" })
        print("bundle tiled_tiles: \(b.calls.count) calls, worst relative input " +
              "difference \(replay.worstInputDifference)")
        // a tile size without its program, tiles other than the programs': refused by name
        XCTAssertEqual(try assertRefusesWhatPythonRefuses(
            folder.appendingPathComponent("bad_manifests.json")), 2)
    }

    /// CogVideoX (DDIM with v-prediction and dynamic guidance, joint text+video blocks, the
    /// decoder by its frame batches with their caches) and LTX-Video (LTX's flow-match
    /// schedule, a decoder conditioned on a timestep) through the same pipeline: every block
    /// call of each bundle with the recorded inputs, the same frames and trace. The LTX
    /// decoder's decode_t, decode_noise_scale and decode_noise are the manifest's `decode`
    /// and the seed's second draw, as the Python side fed them.
    func testCogVideoXAndLTXBundlesReplayWithTheSameCallsAndFrames() throws {
        let families = try replayFolder().appendingPathComponent("families")
        var counts: [String: Int] = [:]
        for (family, names) in [("cogvideox", ["seed", "negative_merge_leap", "step_cache"]),
                                ("ltx",
                                 ["seed", "negative_merge_leap", "step_cache", "given_levels"])] {
            let folder = families.appendingPathComponent(family)
            let package = folder.appendingPathComponent("package")
            for name in names {
                let what = "\(family) \(name)"
                let b = try ConformanceBundle(
                    contentsOf: folder.appendingPathComponent("bundles/\(name)"))
                let (replay, _, pipe) = try replayed(b, on: package, what)
                let decoderInputs = Set(
                    b.calls.filter { $0.key.hasPrefix("vae_decoder/") }.flatMap { $0.inputs.keys })
                XCTAssertEqual(decoderInputs.isSuperset(of: Manifest.decodeInputs),
                               pipe.manifest.decode != nil, what)
                counts[family, default: 0] += 1
                print("bundle \(family)_\(name): \(b.calls.count) calls, worst " +
                      "relative input difference \(replay.worstInputDifference)")
            }
        }
        XCTAssertEqual(counts, ["cogvideox": 3, "ltx": 4])
        // given noise levels: the package's LTX schedule through a distilled model's list
        let given = try ConformanceBundle(
            contentsOf: families.appendingPathComponent("ltx/bundles/given_levels"))
        var settings = SamplerSettings()
        try given.configure(&settings)
        XCTAssertEqual(settings.sigmas, [1.0, 0.95, 0.8, 0.5])
        XCTAssertEqual(settings.steps, 4)
        XCTAssertEqual(given.trace.calls, 4)
        // what the settings exercised: merging, a leap, skipped transformer calls
        for family in ["cogvideox", "ltx"] {
            func trace(_ name: String) throws -> ConformanceBundle.Trace {
                try ConformanceBundle(
                    contentsOf: families.appendingPathComponent("\(family)/bundles/\(name)")).trace
            }
            XCTAssertGreaterThan(try trace("negative_merge_leap").mergedCalls, 0, family)
            XCTAssertNotNil(try trace("negative_merge_leap").leapAt, family)
            let cached = try trace("step_cache")
            XCTAssertLessThan(cached.transformerCalls, cached.calls, family)
        }
    }

    /// A caption bias's -inf against the recording's -inf is no difference (Open-Sora's masked
    /// padding); -inf against a number, or a NaN, still is.
    func testEqualInfinitiesAreNoDifferenceButNaNIs() {
        let bias = Tensor(shape: [3], data: [0, -.infinity, -.infinity])
        XCTAssertEqual(relativeDifference(bias, bias), 0)
        XCTAssertEqual(relativeDifference(Tensor(shape: [3], data: [0.5, -.infinity, -.infinity]),
                                          bias), 0.5)
        XCTAssertEqual(relativeDifference(Tensor(shape: [3], data: [0, -.infinity, 0]), bias),
                       .infinity)
        XCTAssertTrue(relativeDifference(Tensor(shape: [3], data: [.nan, -.infinity, -.infinity]),
                                         bias).isNaN)
    }

    /// Open-Sora 1.2 (RFLOW's levels, the learned null caption under the prompt's mask, or a
    /// negative prompt encoded; STDiT3's spatial-temporal pairs with their TDTM functions, a
    /// leap and the step cache; the temporal VAE's decoder on the whole video): every block
    /// call with the recorded inputs, the same frames and trace; its bad manifest refused as
    /// the Python side refuses it. Skipped where the Python side had no Open-Sora fixture.
    func testOpenSoraBundlesReplayWithTheSameCallsAndFrames() throws {
        let folder = try replayFolder().appendingPathComponent("families/opensora")
        guard FileManager.default.fileExists(atPath: folder.path) else {
            throw XCTSkip("no Open-Sora bundles: the Python side had " +
                          "no Open-Sora fixture (EDGE_OPENSORA_FIXTURE)")
        }
        let package = folder.appendingPathComponent("package")
        var traces: [String: ConformanceBundle.Trace] = [:]
        for name in ["seed", "negative_merge_leap", "step_cache"] {
            let b = try ConformanceBundle(
                contentsOf: folder.appendingPathComponent("bundles/\(name)"))
            let (replay, _, pipe) = try replayed(b, on: package, "opensora \(name)")
            XCTAssertEqual(pipe.manifest.nullCaptionMask, "prompt")
            traces[name] = b.trace
            print("bundle opensora_\(name): \(b.calls.count) calls, worst " +
                  "relative input difference \(replay.worstInputDifference)")
        }
        XCTAssertGreaterThan(traces["negative_merge_leap"]!.mergedCalls, 0)
        XCTAssertNotNil(traces["negative_merge_leap"]!.leapAt)
        XCTAssertLessThan(traces["step_cache"]!.transformerCalls, traces["step_cache"]!.calls)
        XCTAssertEqual(try assertRefusesWhatPythonRefuses(
            folder.appendingPathComponent("bad_manifests.json")), 1)
    }

    /// The decode options: refused by name before any block runs where the package's decoder
    /// takes none, for given latents without the decode noise (unless the scale is 0), and
    /// for noise of another shape; a given noise and timestep reach the decoder as given.
    func testDecodeOptionsAreCheckedBeforeAnyBlockRuns() throws {
        let families = try replayFolder().appendingPathComponent("families")
        let ltx = families.appendingPathComponent("ltx/package")
        let b = try ConformanceBundle(
            contentsOf: families.appendingPathComponent("ltx/bundles/seed"))
        let replay = BundleReplay(b)
        let pipe = try Pipeline(package: ltx, backend: replay)
        let latents = b.tensor(b.latents)
        try assertRefused("given latents",
                          ["decode noise scale 0.025", "given latents", "decodeNoise"]) {
            _ = try pipe.generate(b.prompt, latents: latents)
        }
        try assertRefused("noise shape", ["decodeNoise", "\(latents.shape)"]) {
            _ = try pipe.generate(b.prompt, decodeNoise: Tensor(zeros: [1, 2, 3]))
        }
        try assertRefused("not finite", ["decodeTimestep", "nan"]) {
            _ = try pipe.generate(b.prompt, decodeTimestep: .nan)
        }
        XCTAssertEqual(replay.next, 0, "no block call before a refusal")
        let conditioning = try pipe.decodeConditioning(seed: nil, timestep: 0.1, noiseScale: nil,
                                                       noise: latents)
        XCTAssertEqual(conditioning["decode_t"]?.data, [0.1])
        XCTAssertEqual(conditioning["decode_noise_scale"]?.data, [0.025], "the manifest's scale")
        XCTAssertEqual(conditioning["decode_noise"], latents)
        XCTAssertEqual(try pipe.decodeConditioning(seed: nil, timestep: nil, noiseScale: 0,
                                                   noise: nil)["decode_noise"]?.data
                           .allSatisfy { $0 == 0 }, true)
        let cog = try Pipeline(package: families.appendingPathComponent("cogvideox/package"),
                                   backend: replay)
        try assertRefused("no decode", ["takes no decode timestep or noise"]) {
            _ = try cog.generate("a cat", decodeTimestep: 0.05)
        }
    }

    /// Decode settings without a decoder that takes them, a conditioned decoder without
    /// them or not on whole videos: refused as the Python side refuses them.
    func testRefusesWhatThePythonSideRefusesOfCogVideoXAndLTXManifests() throws {
        let families = try replayFolder().appendingPathComponent("families")
        XCTAssertEqual(try assertRefusesWhatPythonRefuses(
            families.appendingPathComponent("cogvideox/bad_manifests.json")), 1)
        XCTAssertEqual(try assertRefusesWhatPythonRefuses(
            families.appendingPathComponent("ltx/bad_manifests.json")), 2)
    }

    /// The same replay under a budget that streams blocks (the decoder's pieces reload).
    func testAStreamedWanReplayIsTheSame() throws {
        let package = try wanFolder().appendingPathComponent("package")
        let b = try bundle("seed")
        let replay = BundleReplay(b)
        let manifest = try ManifestReader.decode(
            Data(contentsOf: package.appendingPathComponent("manifest.json")))
        let largest = try Pipeline.entries(manifest, root: package).map(\.weightBytes).max()!
        let pipe = try Pipeline(package: package, backend: replay,
                                    budget: largest + largest / 2)
        let report = try pipe.run(b)
        XCTAssertEqual(report.frameBytesDiffering, 0)
        XCTAssertLessThanOrEqual(pipe.loader.stats.peakBytes, largest + largest / 2)
        XCTAssertGreaterThan(pipe.loader.stats.unloads, 0, "nothing was streamed")
    }

    /// Per-block errors: zero where a block gives the recorded outputs, the perturbation
    /// where one does not (the report can tell a wrong block).
    func testBlockErrorsNameTheBlockThatDiffers() throws {
        let package = try wanFolder().appendingPathComponent("package")
        let b = try bundle("seed")
        let exact = try Pipeline(package: package, backend: BundleReplay(b))
            .blockErrors(against: b)
        XCTAssertEqual(Set(exact.map(\.key)).count, exact.count)
        XCTAssertTrue(exact.contains { $0.key == "vae_decoder/up_1#first" })
        XCTAssertEqual(exact.map(\.maxAbsError).max(), 0)
        let off = try Pipeline(package: package,
                                   backend: Perturbed(BundleReplay(b), key: "transformer/block_1",
                                                      by: 0.01))
            .blockErrors(against: b)
        for e in off {
            XCTAssertEqual(e.maxAbsError, e.key == "transformer/block_1" ? 0.01 : 0, accuracy: 1e-6,
                           e.key)
        }
        XCTAssertEqual(off.first { $0.key == "transformer/block_1" }?.calls, b.trace.calls)
    }

    func testRefusesABundleOfAnotherPackage() throws {
        let package = try wanFolder().appendingPathComponent("package")
        let other = try ConformanceBundle(
            contentsOf: wanFolder().appendingPathComponent("tiny_sora_bundle"))
        let pipe = try Pipeline(package: package, backend: BundleReplay(other))
        try assertRefused("other package", ["tiny_sora_bundle/bundle.json", "manifest digest"]) {
            _ = try pipe.run(other)
        }
        try assertRefused("other package, per block", ["manifest digest"]) {
            _ = try pipe.blockErrors(against: other)
        }
    }

    func copyOfBundle(_ name: String) throws -> URL {
        let copy = scratch.appendingPathComponent(name)
        try FileManager.default.copyItem(
            at: try wanFolder().appendingPathComponent("bundles").appendingPathComponent(name),
            to: copy)
        return copy
    }

    func testRefusesATruncatedOrChangedBundle() throws {
        let copy = try copyOfBundle("seed")
        let tensors = copy.appendingPathComponent("tensors.bin")
        let data = try Data(contentsOf: tensors)
        try data.prefix(data.count - 8).write(to: tensors)
        try assertRefused("truncated", ["tensors.bin", "truncated"]) {
            _ = try ConformanceBundle(contentsOf: copy)
        }
        var changed = data
        changed[changed.count - 1] ^= 0x40
        try changed.write(to: tensors)
        try assertRefused("changed", ["tensors.bin", "sha256"]) {
            _ = try ConformanceBundle(contentsOf: copy)
        }
        let json = copy.appendingPathComponent("bundle.json")
        let body = try Data(contentsOf: json)
        try body.prefix(body.count / 2).write(to: json)
        try assertRefused("truncated bundle.json", ["bundle.json", "not valid JSON", "truncated"]) {
            _ = try ConformanceBundle(contentsOf: copy)
        }
        try Data("[1, 2]".utf8).write(to: json)
        try assertRefused("a list", ["bundle.json", "not a JSON object"]) {
            _ = try ConformanceBundle(contentsOf: copy)
        }
        try FileManager.default.removeItem(at: json)
        try assertRefused("no bundle.json", ["bundle.json", "missing"]) {
            _ = try ConformanceBundle(contentsOf: copy)
        }
    }

    /// A bundle.json edited by `change`, written back (the arrays untouched).
    func edited(_ change: (inout [String: Any]) -> Void) throws -> ConformanceBundle {
        let copy = scratch.appendingPathComponent("edited-\(UUID().uuidString)")
        try FileManager.default.copyItem(at: try wanFolder().appendingPathComponent("bundles/seed"),
                                         to: copy)
        let url = copy.appendingPathComponent("bundle.json")
        var body = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as! [String: Any]
        change(&body)
        try JSONSerialization.data(withJSONObject: body).write(to: url)
        return try ConformanceBundle(contentsOf: copy)
    }

    /// A bundle whose seed does not draw its recorded latents is refused before any block
    /// call; one without a seed (recorded from given latents) runs from its latents.
    func testASeedThatDoesNotDrawTheRecordedLatentsIsRefused() throws {
        let package = try wanFolder().appendingPathComponent("package")
        let other = try edited { $0["seed"] = 1 }
        let replay = BundleReplay(other)
        let pipe = try Pipeline(package: package, backend: replay)
        try assertRefused("seed 1", ["bundle.json", "seed 1", "differ from the recorded latents"]) {
            _ = try pipe.run(other)
        }
        XCTAssertEqual(replay.next, 0, "no block call before the refusal")
        let given = try edited { $0["seed"] = NSNull() }
        XCTAssertNil(given.seed)
        let report = try Pipeline(package: package, backend: BundleReplay(given)).run(given)
        XCTAssertNil(report.seedLatentsDifference)
        XCTAssertEqual(report.frameBytesDiffering, 0)
        XCTAssertEqual(report.frames!.noise, given.tensor(given.latents))
    }

    func testRefusesABundleSeedThatIsNoSeed() throws {
        for (value, words) in [(-1 as Any, ["seed -1", "out of range"]),
                               (1.5, ["seed 1.5", "whole number"]),
                               ("7", ["seed", "whole number"])] {
            try assertRefused("seed \(value)", ["bundle.json"] + words) {
                _ = try edited { $0["seed"] = value }
            }
        }
    }

    func testRefusesCallsThatAreNotThisPackagesBlocks() throws {
        let package = try wanFolder().appendingPathComponent("package")
        let manifest = try ManifestReader.decode(
            Data(contentsOf: package.appendingPathComponent("manifest.json")))
        func call(_ i: Int, _ change: @escaping (inout [String: Any]) -> Void)
            -> (inout [String: Any]) -> Void {
            return { body in
                var calls = body["calls"] as! [[String: Any]]
                change(&calls[i])
                body["calls"] = calls
            }
        }
        let unknown = try edited(call(12, { $0["key"] = "transformer/block_9" }))
        try assertRefused("unknown block", ["bundle.json", "call 12", "transformer/block_9"]) {
            try unknown.check(manifest)
        }
        let renamed = try edited(call(3, { c in
            var inputs = c["inputs"] as! [String: Any]
            inputs["mask"] = inputs.removeValue(forKey: "attention_mask")
            c["inputs"] = inputs
        }))
        try assertRefused("renamed input", ["call 3", "text_encoder/final", "mask"]) {
            try renamed.check(manifest)
        }
        let reshaped = try edited(call(8, { c in
            var inputs = c["inputs"] as! [String: Any]
            var latent = inputs["latent"] as! [String: Any]
            latent["shape"] = [1, 16, 3, 4, 6]
            inputs["latent"] = latent
            c["inputs"] = inputs
        }))
        try assertRefused("reshaped input",
                          ["call 8", "transformer/prologue", "latent", "[1, 16, 3, 4, 6]"]) {
            try reshaped.check(manifest)
        }
    }

    func testRefusesAnArrayOutsideTheTensorFile() throws {
        try assertRefused("outside", ["call 0", "input_ids", "outside tensors.bin"]) {
            _ = try edited { body in
                var calls = body["calls"] as! [[String: Any]]
                var inputs = calls[0]["inputs"] as! [String: Any]
                var ids = inputs["input_ids"] as! [String: Any]
                ids["offset"] = 1 << 40
                inputs["input_ids"] = ids
                calls[0]["inputs"] = inputs
                body["calls"] = calls
            }
        }
    }

    /// Every path a bundle names stays inside it: `tensors.path` leading up and out, an
    /// absolute one, or a tensors.bin that is a link to a file elsewhere are refused before
    /// anything is read.
    func testABundleReadsNoFileOutsideItself() throws {
        for path in ["../../OTHER/tensors.bin", "/etc/shadow", "../seed/tensors.bin"] {
            try assertRefused(path, ["tensors.path", path, "escapes the bundle folder"]) {
                _ = try edited { body in
                    var entry = body["tensors"] as! [String: Any]
                    entry["path"] = path
                    body["tensors"] = entry
                }
            }
        }
        let copy = try copyOfBundle("seed")
        let outside = scratch.appendingPathComponent("outside-\(UUID().uuidString).bin")
        let tensors = copy.appendingPathComponent("tensors.bin")
        try FileManager.default.moveItem(at: tensors, to: outside)
        try FileManager.default.createSymbolicLink(at: tensors, withDestinationURL: outside)
        try assertRefused("a link out", ["tensors.bin", "escapes the bundle folder"]) {
            _ = try ConformanceBundle(contentsOf: copy)
        }
    }

    /// Sizes and counts from bundle.json are bounded, with overflow-safe arithmetic, before
    /// any allocation: a shape of 2^120 values is refused, not a crash; 10^9 steps are refused
    /// before a step is planned.
    func testHugeShapesAndCountsAreRefusedBeforeAnyAllocation() throws {
        try assertRefused("huge shape", ["latents", "outside tensors.bin"]) {
            _ = try edited { body in
                var latents = body["latents"] as! [String: Any]
                latents["shape"] = [1 << 40, 1 << 40, 1 << 40, 1, 1]
                body["latents"] = latents
            }
        }
        let package = try wanFolder().appendingPathComponent("package")
        let many = try edited { body in
            var settings = body["settings"] as! [String: Any]
            settings["steps"] = 1_000_000_000
            body["settings"] = settings
        }
        let replay = BundleReplay(many)
        try assertRefused("steps", ["steps=1000000000", "more than 10000"]) {
            _ = try Pipeline(package: package, backend: replay).run(many)
        }
        XCTAssertEqual(replay.next, 0, "no block call before the refusal")
        XCTAssertNil(checkedCount([1 << 40, 1 << 40, 1 << 40]))
        XCTAssertNil(checkedCount([3, -1]))
        XCTAssertEqual(checkedCount([2, 3, 4], width: 4, limit: 96), 24)
        XCTAssertNil(checkedCount([2, 3, 4], width: 4, limit: 95))
    }

    /// What the Python side refuses of a Wan manifest, the Swift runtime refuses too (a
    /// chunked decoder's state without a first variant among them).
    func testRefusesWhatThePythonSideRefusesOfAWanManifest() throws {
        let cases = try assertRefusesWhatPythonRefuses(
            wanFolder().appendingPathComponent("bad_manifests.json"))
        XCTAssertEqual(cases, 5)
    }

    /// A tiny-sora bundle (learned null caption, frame-by-frame decoding) on its own package.
    func testATinySoraBundleReplaysOnItsPackage() throws {
        guard let path = ProcessInfo.processInfo.environment["EDGE_SWIFT_REPLAY"] else {
            throw XCTSkip("EDGE_SWIFT_REPLAY is not set")
        }
        let b = try ConformanceBundle(
            contentsOf: wanFolder().appendingPathComponent("tiny_sora_bundle"))
        XCTAssertNil(b.negativePrompt)
        let replay = BundleReplay(b)
        let pipe = try Pipeline(
            package: URL(fileURLWithPath: path).appendingPathComponent("package"), backend: replay)
        let report = try pipe.run(b)
        XCTAssertTrue(replay.finished)
        XCTAssertEqual(report.frameBytesDiffering, 0)
        XCTAssertGreaterThan(report.frames!.trace.mergedCalls, 0)
    }
    /// A Core AI program cut short is refused before Core AI reads it: by the bytecode's
    /// framing, or, where main.hash was changed, by Core AI's own digest against the manifest.
    func checkTruncatedProgramsAreRefused(_ manifest: Manifest, _ package: URL) throws {
        let copy = FileManager.default.temporaryDirectory
            .appendingPathComponent("edge-cut-\(UUID().uuidString)")
        try FileManager.default.copyItem(at: package, to: copy)
        defer { try? FileManager.default.removeItem(at: copy) }
        let entry = try Pipeline.entries(manifest, root: copy)[0]
        let bytecode = entry.program.appendingPathComponent("main.mlirb")
        let whole = try Data(contentsOf: bytecode)
        try whole.prefix(whole.count - 1000).write(to: bytecode)
        XCTAssertThrowsError(try ProgramRuntime.coreAI.check(entry)) {
            XCTAssertTrue("\($0)".contains("main.mlirb: not a whole Core AI program (block " +
                                           "\(entry.key)): the bytecode ends "), "\($0)")
            XCTAssertTrue("\($0)".contains("truncated"), "\($0)")
        }
        try Data(repeating: 7, count: 32).write(to: entry.program
                                                 .appendingPathComponent("main.hash"))
        XCTAssertThrowsError(try ProgramRuntime.coreAI.check(entry)) {
            XCTAssertTrue("\($0)".contains("its sha256 in the manifest is not the one Core AI " +
                                           "wrote beside it in main.hash"), "\($0)")
        }
    }

}

/// A backend whose block `key` answers `by` more than the recording on every output.
final class Perturbed: BlockBackend {
    let inner: BundleReplay, key: String, by: Float
    init(_ inner: BundleReplay, key: String, by: Float) {
        self.inner = inner
        self.key = key
        self.by = by
    }
    func load(_ entry: BlockEntry) throws -> LoadedBlock {
        let block = try inner.load(entry)
        return entry.key == key ? Shifted(block, by) : block
    }
    final class Shifted: LoadedBlock {
        let block: LoadedBlock, by: Float
        init(_ block: LoadedBlock, _ by: Float) { self.block = block; self.by = by }
        func predict(_ inputs: [String: Tensor]) throws -> [String: Tensor] {
            try block.predict(inputs).mapValues {
                Tensor(shape: $0.shape, data: $0.data.map { $0 + by })
            }
        }
    }
}
