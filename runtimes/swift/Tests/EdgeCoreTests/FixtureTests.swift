import Foundation
import XCTest
@testable import EdgeCore

/// The JSON fixtures the Python side writes (tests/sampler_fixtures.py,
/// tests/swift_fixtures.py), read from the repository this package sits in.
enum Fixtures {
    // runtimes/swift/Tests/EdgeCoreTests/FixtureTests.swift -> the repository root
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("tests/fixtures")

    static func url(_ path: String) -> URL { root.appendingPathComponent(path) }

    static func json(_ path: String) throws -> Any {
        try JSONSerialization.jsonObject(with: Data(contentsOf: url(path)))
    }

    static func object(_ path: String) throws -> [String: Any] {
        try XCTUnwrap(json(path) as? [String: Any])
    }

    static func settings(_ value: Any) throws -> SamplerSettings {
        let data = try JSONSerialization.data(withJSONObject: value)
        return try ManifestReader.jsonDecoder().decode(SamplerSettings.self, from: data)
    }
}

/// A JSON number as the Double that Python wrote. Foundation on Linux parses non-integer
/// numbers into NSDecimalNumber, whose doubleValue can be off in the last digit; its decimal
/// text, parsed by Double(_:), is exact.
func number(_ value: Any?) -> Double {
    if let decimal = value as? NSDecimalNumber { return Double(decimal.stringValue) ?? .nan }
    return (value as? NSNumber)?.doubleValue ?? .nan
}

/// Nested JSON arrays of numbers -> flat values and shape.
func flatten(_ value: Any) -> (shape: [Int], values: [Double]) {
    if let list = value as? [Any] {
        let parts = list.map(flatten)
        return ([list.count] + (parts.first?.shape ?? []), parts.flatMap(\.values))
    }
    return ([], [number(value)])
}

func tensor(_ value: Any) -> Tensor {
    let (shape, values) = flatten(value)
    return Tensor(shape: shape, data: values.map { Float($0) })
}

func assertClose(_ got: [Double], _ want: [Double], _ tolerance: Double, _ what: String,
                 file: StaticString = #filePath, line: UInt = #line) {
    XCTAssertEqual(got.count, want.count, what, file: file, line: line)
    for (i, (g, w)) in zip(got, want).enumerated() where abs(g - w) > tolerance * max(1, abs(w)) {
        XCTFail("\(what)[\(i)]: \(g) vs \(w)", file: file, line: line)
        return
    }
}

/// A run of a fixture written by tests/swift_fixtures.py replay_runs, replayed through
/// `sample()`: the recorded (cond, uncond) of call i answer call i.
struct ReplayedRun {
    let name: String
    let settings: SamplerSettings
    let calls: [(index: Int, t: Float, merged: Bool, last: Bool)]
    let trace: Trace
    let x: Tensor
    let expected: [String: Any]

    init(_ run: [String: Any]) throws {
        name = run["name"] as! String
        settings = try Fixtures.settings(run["settings"]!)
        let cond = (run["cond"] as! [Any]).map(tensor),
            uncond = (run["uncond"] as! [Any]).map(tensor)
        let noise = tensor(run["noise"]!)
        var calls: [(index: Int, t: Float, merged: Bool, last: Bool)] = []
        var trace = Trace()
        x = sample(predict: { _, t, step in
            calls.append((step.index, t, step.merged, step.last))
            return (cond[step.index].reshaped([1] + cond[step.index].shape),
                    uncond[step.index].reshaped([1] + uncond[step.index].shape))
        }, noise: noise.reshaped([1] + noise.shape), settings: settings, trace: &trace)
        self.calls = calls
        self.trace = trace
        expected = run["expected"] as! [String: Any]
    }

    /// Every call's index, flags and model time (float32 for float32: a leap's tail re-plans
    /// them) and the trace's counts and leap are the recorded ones.
    func assertCallsAndTrace(file: StaticString = #filePath, line: UInt = #line) {
        let want = expected["calls"] as! [[String: Any]]
        XCTAssertEqual(calls.count, want.count, name, file: file, line: line)
        for (g, w) in zip(calls, want) {
            XCTAssertEqual(g.index, w["index"] as? Int, name, file: file, line: line)
            XCTAssertEqual(g.merged, w["merged"] as? Bool, "\(name) call \(g.index)", file: file,
                           line: line)
            XCTAssertEqual(g.last, w["last"] as? Bool, "\(name) call \(g.index)", file: file,
                           line: line)
            XCTAssertEqual(g.t, Float(number(w["t"])), "\(name) call \(g.index)", file: file,
                           line: line)
        }
        let wantTrace = expected["trace"] as! [String: Any]
        XCTAssertEqual(trace.calls, wantTrace["calls"] as? Int, name, file: file, line: line)
        XCTAssertEqual(trace.transformerCalls, wantTrace["transformer_calls"] as? Int, name,
                       file: file, line: line)
        XCTAssertEqual(trace.mergedCalls, wantTrace["merged_calls"] as? Int, name, file: file,
                       line: line)
        XCTAssertEqual(trace.leapAt, wantTrace["leap_at"] as? Int, name, file: file, line: line)
    }

    var wantCosines: [Double] { flatten((expected["trace"] as! [String: Any])["cosines"]!).values }
    var wantLatent: (shape: [Int], values: [Double]) { flatten(expected["latent"]!) }
}

final class SamplerFixtureTests: XCTestCase {
    func testLeapFixtures() throws {
        // the guidance fixtures' unconditional velocities differ (guidance and its cutoff count)
        for name in ["leap_straight_dynamic", "leap_curved_dynamic", "leap_fixed", "leap_off",
                     "leap_fixed_tail", "leap_dynamic_tail", "guidance_cutoff",
                     "guidance_below_one", "guidance_cutoff_leap", "given_sigmas",
                     "given_sigmas_leap"] {
            let f = try Fixtures.object("sampler/\(name).json")
            let settings = try Fixtures.settings(f["settings"]!)
            let velocities = (f["velocities"] as! [Any]).map(tensor)
            let uncond = ((f["uncond_velocities"] ?? f["velocities"]) as! [Any]).map(tensor)
            let noise = tensor(f["noise"]!)
            var trace = Trace()
            var times = [Float]()
            var guided = [Bool]()
            let x = sample(predict: { _, t, step in
                times.append(t)
                guided.append(step.guided)
                let v = velocities[step.index].reshaped([1] + velocities[step.index].shape)
                let u = uncond[step.index].reshaped([1] + uncond[step.index].shape)
                return (v, step.guided ? u : nil)
            }, noise: noise.reshaped([1] + noise.shape), settings: settings, trace: &trace)
            let expected = f["expected"] as! [String: Any]
            if let want = expected["guided"] as? [Bool] {
                XCTAssertEqual(guided, want, name)
                XCTAssertEqual(trace.guidedCalls, expected["guided_calls"] as? Int, name)
            }
            XCTAssertEqual(trace.calls, expected["calls"] as? Int, name)
            XCTAssertEqual(trace.leapAt, expected["leap_at"] as? Int, name)
            assertClose(trace.cosines, flatten(expected["cosines"]!).values, 1e-12,
                        "\(name) cosines")
            // the times each call was told, float32 for float32 (a leap's tail re-plans them)
            XCTAssertEqual(times, flatten(expected["times"]!).values.map { Float($0) }, name)
            assertClose(x.data.map(Double.init), flatten(expected["latent"]!).values, 1e-6,
                        "\(name) latent")
        }
    }

    func testStepCacheFixture() throws {
        let f = try Fixtures.object("sampler/cache.json")
        let indicators = (f["indicators"] as! [Any]).map { flatten($0).values }
        let cache = StepCache(threshold: number(f["threshold"]))
        var computed: [Bool] = []
        for (i, indicator) in indicators.enumerated() {
            let batch = indicator.count  // the Python replay's indicators are 1-D
            let compute = cache.shouldCompute(indicator, batch: batch,
                                              force: i == 0 || i == indicators.count - 1)
            if compute {
                cache.store(before: Tensor(zeros: [batch]),
                            after: Tensor(shape: [batch],
                                          data: [Float](repeating: 1, count: batch)))
            }
            computed.append(compute)
        }
        XCTAssertEqual(computed, (f["expected"] as! [String: Any])["computed"] as? [Bool])
    }

    func testTimesteps() throws {
        for case let c as [String: Any] in try Fixtures.json("swift/timesteps.json") as! [Any] {
            let got = timesteps(try Fixtures.settings(c["settings"]!)).map(Double.init)
            assertClose(got, flatten(c["timesteps"]!).values, 0, "timesteps")
        }
    }

    func testGuidedMergeRuns() throws {
        for case let run as [String: Any]
            in try Fixtures.json("swift/guided_merge.json") as! [Any] {
            let settings = try Fixtures.settings(run["settings"]!)
            let cond = (run["cond"] as! [Any]).map(tensor),
                uncond = (run["uncond"] as! [Any]).map(tensor)
            let noise = tensor(run["noise"]!)
            var calls: [[String: Any]] = []
            var trace = Trace()
            let x = sample(predict: { _, t, step in
                calls.append(["index": step.index, "t": Double(t), "merged": step.merged,
                              "last": step.last])
                return (cond[step.index].reshaped([1] + cond[step.index].shape),
                        uncond[step.index].reshaped([1] + uncond[step.index].shape))
            }, noise: noise.reshaped([1] + noise.shape), settings: settings, trace: &trace)
            let expected = run["expected"] as! [String: Any]
            let want = expected["calls"] as! [[String: Any]]
            XCTAssertEqual(calls.count, want.count)
            for (g, w) in zip(calls, want) {
                XCTAssertEqual(g["index"] as? Int, w["index"] as? Int)
                XCTAssertEqual(g["merged"] as? Bool, w["merged"] as? Bool)
                XCTAssertEqual(g["last"] as? Bool, w["last"] as? Bool)
                XCTAssertEqual(number(g["t"]), number(w["t"]), accuracy: 0)
            }
            let wantTrace = expected["trace"] as! [String: Any]
            XCTAssertEqual(trace.calls, wantTrace["calls"] as? Int)
            XCTAssertEqual(trace.mergedCalls, wantTrace["merged_calls"] as? Int)
            XCTAssertEqual(trace.leapAt, wantTrace["leap_at"] as? Int)
            assertClose(x.data.map(Double.init), flatten(expected["latent"]!).values, 1e-6,
                        "latent")
        }
    }

    func testModulatedInput() throws {
        let f = try Fixtures.object("swift/modulated_input.json")
        let got = modulatedInput(tensor(f["x"]!), tensor(f["t_mod"]!))
        assertClose(got, flatten(f["expected"]!).values, 1e-12, "modulated input")
    }
}

final class TokenizerFixtureTests: XCTestCase {
    func testMatchesPythonTokenizer() throws {
        let f = try Fixtures.object("swift/tokens.json")
        let tok = try WordPieceTokenizer(contentsOf: Fixtures.url("swift/tokenizer.json"),
                                         maxTokens: f["max_tokens"] as! Int)
        let prompts = f["prompts"] as! [String]
        let ids = f["input_ids"] as! [[Int]], masks = f["attention_mask"] as! [[Int]]
        for (i, prompt) in prompts.enumerated() {
            let (gotIds, gotMask) = tok.encode(prompt)
            XCTAssertEqual(gotIds.map(Int.init), ids[i], prompt)
            XCTAssertEqual(gotMask.map(Int.init), masks[i], prompt)
        }
    }
}

final class ManifestFixtureTests: XCTestCase {
    func testDecodesAnIphoneManifest() throws {
        let m = try ManifestReader.decode(
            Data(contentsOf: Fixtures.url("swift/manifest_iphone.json")))
        XCTAssertEqual(m.target, "iphone")
        XCTAssertEqual(m.coreml.computeUnits, "cpuAndNeuralEngine")
        XCTAssertEqual(m.tokenizer.maxTokens, 16)
        XCTAssertEqual(m.latentShape.count, 4)
        let transformer = try m.component("transformer")
        XCTAssertEqual(transformer.blocks.first?.name, "prologue")
        XCTAssertEqual(transformer.blocks.last?.name, "epilogue")
        let pairs = transformer.blocks.filter { $0.name.hasPrefix("pair_") }
        XCTAssertFalse(pairs.isEmpty)
        XCTAssertTrue(pairs.allSatisfy { $0.variants?["tdtm"] != nil })
        XCTAssertEqual(try m.component("text_encoder").blocks[0].inputs.map(\.dtype),
                       ["int32", "int32"])
        XCTAssertEqual(m.sampler.steps, 30)
        // tiny-sora's --leap: after 6 steps, the rest in 10
        XCTAssertEqual(m.sampler.leapAfter, 6)
        XCTAssertEqual(m.sampler.leapSteps, 10)
        XCTAssertTrue(m.allFiles.allSatisfy { !$0.sha256.isEmpty && $0.bytes > 0 })
    }

    func testRefusesAnUnknownVersion() throws {
        let data = try Data(contentsOf: Fixtures.url("swift/manifest_bad_version.json"))
        XCTAssertThrowsError(try ManifestReader.decode(data)) { error in
            XCTAssertTrue("\(error)".contains("unknown format_version 2"), "\(error)")
        }
    }

    /// A chunked component's pieces as edge/core/pieces.py piece_bounds cuts them: CogVideoX's
    /// decoder takes a first call of three latent frames, then two at a time.
    func testChunkedPiecesTakeTheirFirstSize() throws {
        let json = #"{"input": "z", "output": "frames", "axis": 1, "size": 2, "# +
            #""first_variant": "first", "first_size": 3, "output_axis": 2, "state": []}"#
        let spec = try ManifestReader.jsonDecoder().decode(Manifest.Chunked.self,
                                                           from: Data(json.utf8))
        XCTAssertEqual(spec.firstSize, 3)
        XCTAssertEqual(spec.outputAxis, 2)
        XCTAssertEqual(spec.pieceBounds(7), [0..<3, 3..<5, 5..<7])
        XCTAssertEqual(spec.pieceBounds(3), [0..<3])
        XCTAssertNil(spec.pieceBounds(6))
        XCTAssertNil(spec.pieceBounds(2))
        let plain = #"{"input": "z", "output": "frames", "axis": 2, "size": 1, "# +
            #""first_variant": "first", "state": []}"#
        let wan = try ManifestReader.jsonDecoder().decode(Manifest.Chunked.self,
                                                          from: Data(plain.utf8))
        XCTAssertNil(wan.firstSize)
        XCTAssertEqual(wan.pieceBounds(3), [0..<1, 1..<2, 2..<3])
    }

    func testRefusesUnknownSamplerSettings() {
        XCTAssertThrowsError(try Fixtures.settings(["steps": 4, "warp": true])) { error in
            XCTAssertTrue("\(error)".contains("warp"), "\(error)")
        }
    }
}
