import Foundation
import XCTest
@testable import EdgeCore

/// CogVideoX's dynamic guidance (`dynamicGuidance` on cogvideox_ddim) against
/// tests/fixtures/swift/dynamic_guidance.json (tests/swift_fixtures.py writes it from
/// edge/sampler.py). The scales' float32, with which the guided velocity is computed, and the
/// runs' latents are compared exactly; the scales' float64 within 1e-15 relative, as this
/// platform's cosine need not be glibc's to the last bit.
final class DynamicGuidanceTests: XCTestCase {
    func fixture() throws -> [String: Any] { try Fixtures.object("swift/dynamic_guidance.json") }

    func testFifthPowerIsExactWhereThePowerIsRepresentable() {
        // k^5 below 2^53 is a double: the correctly rounded power is it, whatever pow gives
        for k in [1, 2, 3, 7, 19, 50, 999, 998, 1000] {
            let exact = Double(k * k * k * k * k)
            XCTAssertEqual(fifthPower(Double(k)), exact, "\(k)")
            XCTAssertEqual(fifthPower(-Double(k)), -exact, "-\(k)")  // odd, as Python's **
            XCTAssertEqual(fifthPower(Double(k) / 1024), exact * 0x1p-50, "\(k) / 1024")
        }
        XCTAssertEqual(fifthPower(0), 0)
    }

    func testScalesMatchPython() throws {
        let cases = try XCTUnwrap(try fixture()["scales"] as? [[String: Any]])
        XCTAssertEqual(cases.count, 11)
        var exact = 0, total = 0
        for c in cases {
            let steps = c["steps"] as! Int, guidance = number(c["guidance"])
            let ts = c["timesteps"] as! [Int], want = flatten(c["scales"]!).values
            for (t, w) in zip(ts, want) {
                let got = dynamicGuidance(guidance, timestep: t, steps: steps)
                XCTAssertEqual(Float(got), Float(w), "steps=\(steps) t=\(t)")
                XCTAssertLessThanOrEqual(abs(got - w), 1e-15 * w, "steps=\(steps) t=\(t)")
                exact += got == w ? 1 : 0
                total += 1
            }
        }
        print("dynamic guidance scales: \(exact) of \(total) equal in float64")
    }

    func testSampleRunsReplayPythonBitForBit() throws {
        let runs = try XCTUnwrap(try fixture()["runs"] as? [[String: Any]])
        XCTAssertEqual(runs.count, 8)
        for run in runs {
            let name = run["name"] as! String
            let settings = try Fixtures.settings(run["settings"]!)
            XCTAssertEqual(settings.scheduler, "cogvideox_ddim", name)
            let cond = (run["cond"] as! [Any]).map(tensor), uncond = (run["uncond"] as! [Any]).map(tensor)
            let noise = tensor(run["noise"]!)
            var calls: [(index: Int, t: Float, merged: Bool, last: Bool)] = []
            var trace = Trace()
            let x = sample(predict: { _, t, step in
                calls.append((step.index, t, step.merged, step.last))
                return (cond[step.index].reshaped([1] + cond[step.index].shape),
                        uncond[step.index].reshaped([1] + uncond[step.index].shape))
            }, noise: noise.reshaped([1] + noise.shape), settings: settings, trace: &trace)
            let expected = run["expected"] as! [String: Any]
            let want = expected["calls"] as! [[String: Any]]
            XCTAssertEqual(calls.count, want.count, name)
            for (g, w) in zip(calls, want) {
                XCTAssertEqual(g.index, w["index"] as? Int, name)
                XCTAssertEqual(g.merged, w["merged"] as? Bool, "\(name) call \(g.index)")
                XCTAssertEqual(g.last, w["last"] as? Bool, "\(name) call \(g.index)")
                XCTAssertEqual(g.t, Float(number(w["t"])), "\(name) call \(g.index)")
            }
            let wantTrace = expected["trace"] as! [String: Any]
            XCTAssertEqual(trace.calls, wantTrace["calls"] as? Int, name)
            XCTAssertEqual(trace.transformerCalls, wantTrace["transformer_calls"] as? Int, name)
            XCTAssertEqual(trace.mergedCalls, wantTrace["merged_calls"] as? Int, name)
            XCTAssertEqual(trace.leapAt, wantTrace["leap_at"] as? Int, name)
            assertClose(trace.cosines, flatten(wantTrace["cosines"]!).values, 1e-12, "\(name) cosines")
            XCTAssertEqual(x.data, flatten(expected["latent"]!).values.map { Float($0) }, name)
        }
    }

    func testOnlyCogVideoXDDIMTakesIt() throws {
        XCTAssertEqual(schedulers.filter { $0.type.takesDynamicGuidance }.map(\.name), ["cogvideox_ddim"])
        // SamplerSettings' message (edge/sampler.py), naming the field
        for name in ["flow_euler", "flow_unipc", "ltx_flow_euler"] {
            XCTAssertThrowsError(try Fixtures.settings(["scheduler": name, "dynamic_guidance": true])) { error in
                XCTAssertEqual("\(error)", "sampler setting dynamic_guidance=True: \(name) steps through no "
                               + "training timesteps (only cogvideox_ddim does; CogVideoX's dynamic guidance "
                               + "is a function of them)")
            }
            XCTAssertFalse(try Fixtures.settings(["scheduler": name, "dynamic_guidance": false]).dynamicGuidance)
        }
        XCTAssertTrue(try Fixtures.settings(["scheduler": "cogvideox_ddim", "dynamic_guidance": true]).dynamicGuidance)
        // packages from before the field: the fixed scale
        XCTAssertFalse(try Fixtures.settings(["scheduler": "cogvideox_ddim"]).dynamicGuidance)
        var settings = SamplerSettings()
        settings.dynamicGuidance = true
        XCTAssertThrowsError(try settings.validate())
        settings.scheduler = "cogvideox_ddim"
        XCTAssertNoThrow(try settings.validate())
    }

    func testAtOrBelowOneThePlainScaleStays() {
        var settings = SamplerSettings()
        settings.scheduler = "cogvideox_ddim"
        settings.dynamicGuidance = true
        for guidance in [1.0, 0.5] {
            settings.guidance = guidance
            XCTAssertEqual(stepGuidance(settings, level: 999, steps: 50), guidance)
        }
        settings.guidance = 6
        XCTAssertEqual(stepGuidance(settings, level: 999, steps: 50), dynamicGuidance(6, timestep: 999, steps: 50))
    }
}
