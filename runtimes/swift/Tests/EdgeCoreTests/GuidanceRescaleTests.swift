import Foundation
import XCTest
@testable import EdgeCore

/// LTXPipeline's guidance_rescale (`guidanceRescale`) against
/// tests/fixtures/swift/guidance_rescale.json (tests/swift_fixtures.py writes it from
/// edge/sampler.py): whole sample() runs with it on LTX's schedule with a re-planned leap and
/// TDTM, flow_euler fully rescaled, CogVideoX's dynamic guidance and UniPC with a dynamic
/// leap. Decisions, model times and traces exactly; the latents within 1e-6 (NumPy sums the
/// standard deviations pairwise, this in order).
final class GuidanceRescaleTests: XCTestCase {
    func testSampleRunsReplayPython() throws {
        let runs = try XCTUnwrap(try Fixtures.object("swift/guidance_rescale.json")["runs"] as? [[String: Any]])
        XCTAssertEqual(runs.count, 4)
        var worst: Float = 0
        for run in runs {
            let name = run["name"] as! String
            let settings = try Fixtures.settings(run["settings"]!)
            XCTAssertGreaterThan(settings.guidanceRescale, 0, name)
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
            XCTAssertEqual(calls.map(\.index), want.map { $0["index"] as! Int }, name)
            XCTAssertEqual(calls.map(\.merged), want.map { $0["merged"] as! Bool }, name)
            XCTAssertEqual(calls.map(\.last), want.map { $0["last"] as! Bool }, name)
            XCTAssertEqual(calls.map(\.t), want.map { Float(number($0["t"])) }, name)
            let wantTrace = expected["trace"] as! [String: Any]
            XCTAssertEqual(trace.calls, wantTrace["calls"] as? Int, name)
            XCTAssertEqual(trace.mergedCalls, wantTrace["merged_calls"] as? Int, name)
            XCTAssertEqual(trace.leapAt, wantTrace["leap_at"] as? Int, name)
            let latent = flatten(expected["latent"]!).values.map { Float($0) }
            let off = zip(x.data, latent).map { abs($0 - $1) }.max()!
            worst = max(worst, off)
            XCTAssertLessThanOrEqual(off, 1e-6, name)
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
                XCTAssertEqual("\(error)", "sampler setting guidance_rescale=\(bad): must be a number from 0 (off) to 1 (the guided velocity wholly rescaled)")
            }
        }
        XCTAssertEqual(try Fixtures.settings([:]).guidanceRescale, 0, "packages before the field: off")
    }
}
