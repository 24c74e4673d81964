import Foundation
import XCTest
@testable import EdgeCore

/// The flow_unipc scheduler against tests/fixtures/swift/unipc.json (tests/swift_fixtures.py
/// writes it from edge/core/sampler.py and edge/core/schedulers.py).
///
/// Timesteps, model times, the times each call is told, the 2x2 solves and the trace are
/// compared exactly. Latents are compared within |got - want| <= 2e-6 * max(1, |want|): NumPy
/// computes UniPC's float32 log and expm1 with SIMD routines that are off by a few ULP and
/// differ between CPUs, where this runtime rounds the float64 results (UniPC.swift), so the
/// step scalars can differ in their last bits. The latents of these runs (size ~1) then move
/// by at most 2.7e-7 (measured: 0 in 5 of the 14 runs); 2e-6 is ~17 float32 ULP at 1, well
/// under the 1e-5 that a wrong coefficient or operation order would already exceed.
final class UniPCFixtureTests: XCTestCase {
    static let latentTolerance = 2e-6

    func fixture() throws -> [String: Any] { try Fixtures.object("swift/unipc.json") }

    func testTimestepsAndModelTimes() throws {
        let cases = try XCTUnwrap(try fixture()["timesteps"] as? [[String: Any]])
        XCTAssertEqual(cases.count, 12)
        for c in cases {
            let settings = try Fixtures.settings(c["settings"]!)
            XCTAssertEqual(settings.scheduler, "flow_unipc")
            let what = "steps=\(settings.steps) shift=\(settings.shift) " +
                       "N=\(settings.numTrainTimesteps)"
            XCTAssertEqual(timesteps(settings), flatten(c["timesteps"]!).values.map { Float($0) },
                           what)
            XCTAssertEqual(modelTimes(settings),
                           flatten(c["model_times"]!).values.map { Float($0) }, what)
            XCTAssertEqual(timesteps(settings).count, settings.steps + 1, what)
            XCTAssertEqual(modelTimes(settings).count, settings.steps, what)
        }
    }

    func testSampleRuns() throws {
        let runs = try XCTUnwrap(try fixture()["runs"] as? [[String: Any]])
        XCTAssertEqual(runs.count, 14)
        var worst = 0.0
        for run in try runs.map(ReplayedRun.init) {
            let name = run.name
            XCTAssertEqual(run.settings.scheduler, "flow_unipc", name)
            run.assertCallsAndTrace()
            assertClose(run.trace.cosines, run.wantCosines, 1e-12, "\(name) cosines")
            let wantLatent = run.wantLatent
            XCTAssertEqual(run.x.shape, [1] + wantLatent.shape, name)
            assertClose(run.x.data.map(Double.init), wantLatent.values, Self.latentTolerance,
                        "\(name) latent")
            for (g, w) in zip(run.x.data, wantLatent.values) {
                worst = max(worst, abs(Double(g) - w) / max(1, abs(w)))
            }
        }
        print("UniPC fixture runs: largest latent difference \(worst) (of max(1, |x|))")
    }

    func testSolveMatchesNumPy() throws {
        let cases = try XCTUnwrap(try fixture()["solve"] as? [[String: Any]])
        XCTAssertGreaterThan(cases.count, 100)
        var swapped = 0
        for c in cases {
            let a = (c["a"] as! [[Any]]).map { $0.map { Float(number($0)) } }
            let b = (c["b"] as! [Any]).map { Float(number($0)) }
            let want = (c["x"] as! [Any]).map { Float(number($0)) }
            XCTAssertEqual(solve2x2(a, b), want, "a=\(a) b=\(b)")
            if abs(a[1][0]) > abs(a[0][0]) { swapped += 1 }
        }
        XCTAssertGreaterThan(swapped, 20)  // both branches of the pivoting are covered
    }
}

final class UniPCTests: XCTestCase {
    func unipc(_ steps: Int, shift: Double = 3.0) -> SamplerSettings {
        var s = SamplerSettings()
        s.scheduler = "flow_unipc"
        s.steps = steps
        s.shift = shift
        return s
    }

    func testRefusesAnUnknownScheduler() throws {
        for name in ["ddim", "flow_euler_x", ""] {
            XCTAssertThrowsError(try Fixtures.settings(["scheduler": name])) { error in
                // the message edge/core/sampler.py's SamplerSettings gives
                XCTAssertEqual("\(error)", "sampler setting scheduler='\(name)': " +
                                           "known: flow_euler, flow_unipc, " +
                                           "cogvideox_ddim, ltx_flow_euler, rflow")
            }
        }
        XCTAssertThrowsError(try Fixtures.settings(["scheduler": "it's"])) { error in
            XCTAssertEqual("\(error)", "sampler setting scheduler=\"it's\": known: flow_euler, " +
                                       "flow_unipc, cogvideox_ddim, ltx_flow_euler, rflow")
        }
        var s = SamplerSettings()
        s.scheduler = "unipc"
        XCTAssertThrowsError(try s.validate())
        for name in knownSchedulers {
            XCTAssertEqual(try Fixtures.settings(["scheduler": name, "steps": 4]).scheduler, name)
        }
    }

    func testSigmasAndModelTimes() {
        // 1 nudged below 1 (then float32), shifted and decreasing, ending at 0
        for steps in [1, 2, 5, 30] {
            let ts = timesteps(unipc(steps, shift: 5))
            XCTAssertEqual(ts.first, Float(1.0 - 1e-6))
            XCTAssertEqual(ts.last, 0)
            XCTAssertTrue(zip(ts, ts.dropFirst()).allSatisfy { $0 > $1 }, "\(ts)")
            let times = modelTimes(unipc(steps, shift: 5))
            XCTAssertEqual(times.first, Float(0.999))
            // whole training steps, at or below the sigmas
            for (t, s) in zip(times, ts) {
                XCTAssertEqual(Double(t) * 1000, (Double(t) * 1000).rounded(), accuracy: 1e-3)
                XCTAssertLessThanOrEqual(t, s)
            }
        }
        // flow_euler keeps telling the sigmas
        var euler = SamplerSettings()
        euler.steps = 6
        XCTAssertEqual(modelTimes(euler), Array(timesteps(euler).dropLast()))
        XCTAssertEqual(wholeStepTimes([Float(0.5004), 0.0999], numTrainTimesteps: 1000),
                       [0.5, 0.099])
    }

    func testLeapTailModelTimes() {
        var s = unipc(30)
        s.leapSteps = 4
        let (sigmas, times) = scheduler(of: s).tail(from: 0.8, min: 0.05, steps: s.leapSteps)
        XCTAssertEqual(sigmas, leapTail(from: 0.8, to: 0.05, steps: 4, shift: 3))
        XCTAssertEqual(times, wholeStepTimes(Array(sigmas.dropLast()), numTrainTimesteps: 1000))
        s.scheduler = "flow_euler"
        XCTAssertEqual(scheduler(of: s).tail(from: 0.8, min: 0.05, steps: s.leapSteps).modelTimes,
                       Array(sigmas.dropLast()))
    }

    func testSolveByHand() {
        // no pivoting, and pivoting (|a10| > |a00| swaps the rows)
        XCTAssertEqual(solve2x2([[1, 1], [-0.5, 1]], [3, 0]), [2, 1])
        XCTAssertEqual(solve2x2([[1, 1], [-4, 1]], [5, -10]), [3, 2])
        XCTAssertEqual(solve2x2([[2, 0], [0, 4]], [1, 1]), [0.5, 0.25])
    }

    func testOneStepLandsOnThePredictedX0() {
        // steps = 1: first order from sigma_0 to 0, x0 = x - sigma_0 v exactly
        let settings = unipc(1)
        let ts = timesteps(settings)
        let x = Tensor(shape: [1, 3], data: [0.3, -1.2, 2.5]),
            v = Tensor(shape: [1, 3], data: [0.7, -0.1, 1.9])
        let out = UniPCFlow(sigmas: ts).step(v, 0, x)
        XCTAssertEqual(out.data, zip(x.data, v.data).map { $0 - ts[0] * $1 })
    }

    func testGenerationsAreIndependent() {
        // all state lives in one sample call: the same inputs give the same latents twice
        var settings = unipc(8)
        settings.guidance = 3
        let noise = Tensor(shape: [1, 4], data: [0.5, -1, 1.5, 0.25])
        func run() -> Tensor {
            var trace = Trace()
            return sample(predict: { x, t, _ in
                (x.reshaped(x.shape), Tensor(shape: x.shape, data: x.data.map { $0 * t }))
            }, noise: noise, settings: settings, trace: &trace)
        }
        let first = run()
        XCTAssertEqual(first, run())
        XCTAssertTrue(first.data.allSatisfy(\.isFinite))
    }
}
