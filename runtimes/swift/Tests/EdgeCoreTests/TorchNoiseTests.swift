import Foundation
import XCTest
@testable import EdgeCore

/// What a seed means (TorchNoise, edge/core/noise.py): PyTorch's own torch.randn for the seed,
/// held to tests/fixtures/noise/torch_randn.json (tests/noise_fixtures.py, written by torch).
final class TorchNoiseTests: XCTestCase {
    /// Every case of the fixture: all values within 1e-5 of torch's, or for the large cases
    /// (Wan's 16x21x60x104) the sampled values within 1e-5 and the float64 sum within 1e-3
    /// relative.
    func testEveryTorchFixtureCase() throws {
        let f = try Fixtures.object("noise/torch_randn.json")
        XCTAssertEqual(f["definition"] as? String, TorchNoise.definition)
        let cases = try XCTUnwrap(f["cases"] as? [[String: Any]])
        XCTAssertGreaterThanOrEqual(cases.count, 100)
        var worst = 0.0, sampled = 0
        for c in cases {
            let seedText = try XCTUnwrap(c["seed"] as? String)
            let seed = try XCTUnwrap(UInt64(seedText), seedText)
            let shape = try XCTUnwrap(c["shape"] as? [NSNumber]).map(\.intValue)
            let what = "seed \(seedText) shape \(shape)"
            let got = try TorchNoise.randn(shape: shape, seed: seed)
            XCTAssertEqual(got.shape, shape, what)
            XCTAssertEqual(got.count, (c["count"] as? NSNumber)?.intValue, what)
            var pairs: [(index: Int, want: Double)] = []
            if let values = c["values"] as? [Any] {
                XCTAssertEqual(values.count, got.count, what)
                pairs = values.enumerated().map { ($0.offset, number($0.element)) }
            } else {
                let samples = try XCTUnwrap(c["samples"] as? [String: Any], what)
                let index = try XCTUnwrap(samples["index"] as? [NSNumber]).map(\.intValue)
                let value = try XCTUnwrap(samples["value"] as? [Any]).map(number)
                XCTAssertEqual(index.count, value.count, what)
                XCTAssertTrue(index.contains(got.count - 1), "\(what): the redrawn tail is sampled")
                pairs = Array(zip(index, value))
                let sum = got.data.reduce(0.0) { $0 + Double($1) }, want = number(c["sum"])
                XCTAssertLessThanOrEqual(abs(sum - want), 1e-3 * abs(want),
                                         "\(what): sum \(sum) vs torch's \(want)")
                sampled += 1
            }
            for (i, want) in pairs {
                let d = abs(Double(got.data[i]) - want)
                worst = max(worst, d.isNaN ? .infinity : d)
                if !(d < 1e-5) {
                    XCTFail("\(what)[\(i)]: \(got.data[i]) vs torch's \(want)")
                    break
                }
            }
        }
        XCTAssertGreaterThanOrEqual(sampled, 1, "the fixture's large cases (Wan's latents)")
        print("torch.randn fixtures: \(cases.count) cases, worst absolute difference \(worst)")
    }

    /// The engine takes the seed's low 32 bits (PyTorch's manual_seed): 2^32 + 7 draws what 7
    /// draws, on both paths (under 16 values, and groups of 16 with a redrawn tail).
    func testASeedDrawsWhatItsLow32BitsDraw() throws {
        for count in [1, 5, 15, 16, 17, 100, 1000] {
            XCTAssertEqual(try TorchNoise.randn(count: count, seed: (1 << 32) + 7),
                           try TorchNoise.randn(count: count, seed: 7), "count \(count)")
        }
        XCTAssertNotEqual(try TorchNoise.randn(count: 32, seed: 7),
                          try TorchNoise.randn(count: 32, seed: 8))
    }

    /// A prefix of a draw of a whole number of 16s is the draw of fewer 16s (one word per
    /// value, in order); the same seed draws the same values into a buffer or an array.
    func testDrawsAreConsistent() throws {
        let long = try TorchNoise.randn(count: 64 * 1024, seed: 42)
        XCTAssertEqual(Array(long.prefix(160)), try TorchNoise.randn(count: 160, seed: 42))
        XCTAssertEqual(try TorchNoise.randn(count: 0, seed: 42), [])
        var buffer = [Float](repeating: .nan, count: 777)
        try buffer.withUnsafeMutableBufferPointer { try TorchNoise.fill($0, seed: 42) }
        XCTAssertEqual(buffer, try TorchNoise.randn(count: 777, seed: 42))
        XCTAssertTrue(long.allSatisfy(\.isFinite))
        let mean = long.reduce(0.0) { $0 + Double($1) } / Double(long.count)
        let variance = long.reduce(0.0) { $0 + Double($1) * Double($1) } / Double(long.count)
            - mean * mean
        XCTAssertEqual(mean, 0, accuracy: 0.02)
        XCTAssertEqual(variance, 1, accuracy: 0.02)
    }

    /// Consecutive draws of one generator (LTX-Video's decode noise after the latents): each
    /// draw of the fixture's `draws` within 1e-5 of torch's; the first is randn's own draw;
    /// a draw under 16 values before another is refused by name.
    func testConsecutiveDrawsAreTorchsDrawsOfOneGenerator() throws {
        let f = try Fixtures.object("noise/torch_randn.json")
        let draws = try XCTUnwrap(f["draws"] as? [[String: Any]])
        XCTAssertGreaterThanOrEqual(draws.count, 3)
        for d in draws {
            let seedText = try XCTUnwrap(d["seed"] as? String)
            let seed = try XCTUnwrap(UInt64(seedText))
            let counts = try XCTUnwrap(d["counts"] as? [NSNumber]).map(\.intValue)
            let want = try XCTUnwrap(d["values"] as? [[Any]]).map { $0.map(number) }
            let got = try TorchNoise.randnDraws(counts: counts, seed: seed)
            XCTAssertEqual(got.map(\.count), counts, seedText)
            XCTAssertEqual(got[0], try TorchNoise.randn(count: counts[0], seed: seed))
            for (k, (g, w)) in zip(got, want).enumerated() {
                let worst = zip(g, w).map { abs(Double($0) - $1) }.max() ?? 0
                XCTAssertLessThanOrEqual(worst, 1e-5, "seed \(seedText) draw \(k) of \(counts)")
            }
        }
        XCTAssertThrowsError(try TorchNoise.randnDraws(counts: [9, 100], seed: 1)) { error in
            XCTAssertEqual("\(error)", "noise draws [9, 100]: only the " +
                                       "last may hold under 16 values")
        }
    }

    /// A seed is 0 to 2^63 - 1 (torch.Generator.manual_seed's range); above is refused with
    /// the range named, before anything is drawn.
    func testRefusesASeedOutOfRange() throws {
        XCTAssertEqual(TorchNoise.maxSeed, 9_223_372_036_854_775_807)
        XCTAssertNoThrow(try TorchNoise.randn(count: 3, seed: TorchNoise.maxSeed))
        XCTAssertNoThrow(try TorchNoise.checkSeed(0))
        for seed in [TorchNoise.maxSeed + 1, UInt64.max] {
            XCTAssertThrowsError(try TorchNoise.randn(count: 3, seed: seed)) { error in
                XCTAssertTrue("\(error)".contains("seed \(seed) is out of range"), "\(error)")
                XCTAssertTrue("\(error)".contains("0 to 2^63 - 1"), "\(error)")
            }
        }
        var untouched = [Float](repeating: 7, count: 32)
        XCTAssertThrowsError(
            try untouched.withUnsafeMutableBufferPointer { try TorchNoise.fill($0, seed: .max) })
        XCTAssertEqual(untouched, [Float](repeating: 7, count: 32), "nothing drawn for a refused " +
            "seed")
        XCTAssertThrowsError(try TorchNoise.checkSeed(-1)) { error in
            XCTAssertEqual("\(error)", "seed -1 is out of range: a seed is from 0 to 2^63 - 1")
        }
        XCTAssertEqual(try TorchNoise.checkSeed(Int.max), TorchNoise.maxSeed)
    }

    /// A seed as a command line writes it: decimal digits only; one line naming the value.
    func testParsesASeedFromText() throws {
        XCTAssertEqual(try TorchNoise.seed(parsing: "0"), 0)
        XCTAssertEqual(try TorchNoise.seed(parsing: "42"), 42)
        XCTAssertEqual(try TorchNoise.seed(parsing: "9223372036854775807"), TorchNoise.maxSeed)
        for text in ["-1", "9223372036854775808", "18446744073709551616",
                     "99999999999999999999999"] {
            XCTAssertThrowsError(try TorchNoise.seed(parsing: text, name: "--seed")) { error in
                XCTAssertEqual("\(error)", "--seed \(text) is out of range: " +
                                           "a seed is from 0 to 2^63 - 1")
            }
        }
        for text in ["1.5", "", "+3", "1e3", " 3", "0x10", "three", "-1.5"] {
            XCTAssertThrowsError(try TorchNoise.seed(parsing: text, name: "--seed")) { error in
                XCTAssertEqual("\(error)", "--seed \(text) must be a " +
                                           "whole number from 0 to 2^63 - 1")
            }
        }
    }

    /// A package's `noise` field: only torch.randn/cpu/float32 is drawn; a package without
    /// the field (NumPy PCG64 noise) or with another definition is refused, as edge/core/noise.py
    /// check_noise words it.
    func testRefusesAnotherNoiseDefinition() throws {
        XCTAssertNoThrow(try TorchNoise.checkNoise("torch.randn/cpu/float32"))
        XCTAssertThrowsError(try TorchNoise.checkNoise(nil)) { error in
            XCTAssertEqual("\(error)", "manifest.json: noise 'numpy.pcg64': this runtime " +
                                       "draws a seed as 'torch.randn/cpu/float32', so the " +
                                       "seed would give another video than the package's; " +
                                       "re-export the package or pass the initial latents")
        }
        XCTAssertThrowsError(
            try TorchNoise.checkNoise("philox/cuda", where: "pkg/manifest.json")) { error in
            XCTAssertTrue("\(error)".hasPrefix("pkg/manifest.json: noise 'philox/cuda'"),
                          "\(error)")
        }
    }

    /// The manifest's optional `noise` string: read when present, nil when absent, refused by
    /// name when not a string.
    func testTheManifestReadsItsNoiseField() throws {
        let data = try Data(contentsOf: Fixtures.url("swift/manifest_iphone.json"))
        var body = try XCTUnwrap(JSONSerialization.jsonObject(with: data) as? [String: Any])
        body["noise"] = nil
        XCTAssertNil(try ManifestReader.decode(JSONSerialization.data(withJSONObject: body)).noise)
        body["noise"] = TorchNoise.definition
        XCTAssertEqual(
            try ManifestReader.decode(JSONSerialization.data(withJSONObject: body)).noise,
            TorchNoise.definition)
        body["noise"] = "numpy.pcg64"   // read: refused only when a seed is drawn
        XCTAssertEqual(
            try ManifestReader.decode(JSONSerialization.data(withJSONObject: body)).noise,
            "numpy.pcg64")
        body["noise"] = 3
        XCTAssertThrowsError(
            try ManifestReader.decode(JSONSerialization.data(withJSONObject: body))) { error in
            XCTAssertTrue("\(error)".contains("field noise must be String"), "\(error)")
        }
    }
}
