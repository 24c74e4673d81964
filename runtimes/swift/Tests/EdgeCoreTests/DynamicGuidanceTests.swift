import Foundation
import XCTest
@testable import EdgeCore

/// CogVideoX's dynamic guidance (`dynamicGuidance` on cogvideox_ddim) against
/// tests/fixtures/swift/dynamic_guidance.json (tests/swift_fixtures.py writes it from
/// edge/core/sampler.py). The scales' float32, with which the guided velocity is computed, and the
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
        for run in try runs.map(ReplayedRun.init) {
            XCTAssertEqual(run.settings.scheduler, "cogvideox_ddim", run.name)
            run.assertCallsAndTrace()
            assertClose(run.trace.cosines, run.wantCosines, 1e-12, "\(run.name) cosines")
            XCTAssertEqual(run.x.data, run.wantLatent.values.map { Float($0) }, run.name)
        }
    }

    func testOnlyCogVideoXDDIMTakesIt() throws {
        XCTAssertEqual(schedulers.filter { $0.type.takesDynamicGuidance }.map(\.name),
                       ["cogvideox_ddim"])
        // SamplerSettings' message (edge/core/sampler.py), naming the field
        for name in ["flow_euler", "flow_unipc", "ltx_flow_euler"] {
            XCTAssertThrowsError(try Fixtures.settings(["scheduler": name,
                                                        "dynamic_guidance": true])) { error in
                XCTAssertEqual("\(error)",
                               "sampler setting dynamic_guidance=True: \(name) steps through no "
                               + "training timesteps (only cogvideox_ddim does; CogVideoX's "
                               + "dynamic guidance is a function of them)")
            }
            XCTAssertFalse(try Fixtures.settings(["scheduler": name, "dynamic_guidance": false])
                .dynamicGuidance)
        }
        XCTAssertTrue(try Fixtures.settings(["scheduler": "cogvideox_ddim",
                                             "dynamic_guidance": true]).dynamicGuidance)
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
        XCTAssertEqual(stepGuidance(settings, level: 999, steps: 50),
                       dynamicGuidance(6, timestep: 999, steps: 50))
    }
}
