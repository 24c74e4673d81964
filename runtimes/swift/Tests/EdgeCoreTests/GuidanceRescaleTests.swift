import Foundation
import XCTest
@testable import EdgeCore

/// LTXPipeline's guidance_rescale (`guidanceRescale`) against
/// tests/fixtures/swift/guidance_rescale.json (tests/swift_fixtures.py writes it from
/// edge/core/sampler.py): whole sample() runs with it on LTX's schedule with a re-planned leap and
/// TDTM, flow_euler fully rescaled, CogVideoX's dynamic guidance and UniPC with a dynamic
/// leap. Decisions, model times and traces exactly; the latents within 1e-6 (NumPy sums the
/// standard deviations pairwise, this in order).
final class GuidanceRescaleTests: XCTestCase {
    func testSampleRunsReplayPython() throws {
        let runs = try XCTUnwrap(
            try Fixtures.object("swift/guidance_rescale.json")["runs"] as? [[String: Any]])
        XCTAssertEqual(runs.count, 4)
        var worst: Float = 0
        for run in try runs.map(ReplayedRun.init) {
            XCTAssertGreaterThan(run.settings.guidanceRescale, 0, run.name)
            run.assertCallsAndTrace()
            let off = zip(run.x.data, run.wantLatent.values).map { abs($0 - Float($1)) }.max()!
            worst = max(worst, off)
            XCTAssertLessThanOrEqual(off, 1e-6, run.name)
        }
        print("guidance rescale runs: worst latent difference \(worst)")
    }

    /// The rescaled velocity has the conditional one's spread at 1, is the guided one at 0,
    /// and is computed per sample; outside [0, 1] the setting is refused with Python's message.
    func testRescaleAndItsRefusals() throws {
        let v = Tensor(shape: [2, 3], data: [1, 2, 4, 10, 0, -10])
        let cond = Tensor(shape: [2, 3], data: [0, 1, 2, 0, 3, 6])
        let whole = rescaledGuidance(v, cond, 1)
        // sample 0: std [1, 2, 4] = sqrt(7/3), std [0, 1, 2] = 1
        for (got, want) in zip(whole.data[0...2], [1.0, 2.0, 4.0]) {
            XCTAssertEqual(Double(got), want / (7.0 / 3).squareRoot(), accuracy: 1e-6)
        }
        XCTAssertEqual(rescaledGuidance(v, cond, 0).data, v.data)
        // sample 1 on its own: std [10, 0, -10] = 10, std [0, 3, 6] = 3
        XCTAssertEqual(Double(whole.data[3] - whole.data[5]) / 20, 3.0 / 10, accuracy: 1e-6)
        for bad in [-0.1, 1.5] {
            XCTAssertThrowsError(try Fixtures.settings(["guidance_rescale": bad])) { error in
                XCTAssertEqual("\(error)", "sampler setting guidance_rescale=\(bad): " +
                                           "must be a number from 0 (off) to 1 (the " +
                                           "guided velocity wholly rescaled)")
            }
        }
        XCTAssertEqual(try Fixtures.settings([:]).guidanceRescale, 0,
                       "packages before the field: off")
    }
}
