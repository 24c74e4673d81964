import Foundation
import XCTest
@testable import EdgeCore

/// Each scheduler through its interface alone, by name through the registry, against
/// tests/fixtures/swift/schedulers.json (tests/swift_fixtures.py scheduler_cases, from
/// edge/core/schedulers.py), each with its case's shift_terminal: schedule, tail (where the
/// scheduler has one: cogvideox_ddim's cases hold none) and jump equal bit for bit as Float;
/// the solver's steps on fixed velocities equal bit for bit for flow_euler, cogvideox_ddim and
/// ltx_flow_euler (with and without a terminal), and for flow_unipc within
/// UniPCFixtureTests.latentTolerance (2e-6 * max(1, |want|)): NumPy computes UniPC's float32
/// log and expm1 with its own SIMD routines, a few ULP off and different between CPUs, where
/// UniPC.swift rounds the float64 results, so a step's scalars can differ in their last bits.
final class SchedulersFixtureTests: XCTestCase {
    func cases() throws -> [[String: Any]] {
        try XCTUnwrap(try Fixtures.json("swift/schedulers.json") as? [[String: Any]])
    }

    func floats(_ value: Any?) -> [Float] { flatten(value ?? []).values.map { Float($0) } }

    /// The case's scheduler through the registry, with its shift_terminal (null: nil).
    func scheduler(of c: [String: Any]) throws -> any Scheduler {
        let terminal = c["shift_terminal"] is NSNull ? nil : number(c["shift_terminal"])
        return try EdgeCore.scheduler(named: c["scheduler"] as! String, shift: number(c["shift"]),
                                      numTrainTimesteps: c["num_train_timesteps"] as! Int,
                                      shiftTerminal: terminal)
    }

    func testCoversTheRegistry() throws {
        let cases = try cases()
        XCTAssertEqual(cases.count, 39)
        // the flows through given levels
        XCTAssertEqual(cases.filter { $0["given"] is [Any] }.count, 12)
        // every scheduler the registry knows, in its order, and nothing else
        var names: [String] = []
        for c in cases where !names.contains(c["scheduler"] as! String) {
            names.append(c["scheduler"] as! String)
        }
        XCTAssertEqual(names, knownSchedulers)
    }

    func testScheduleTailAndJump() throws {
        for c in try cases() {
            let name = c["scheduler"] as! String
            let steps = c["steps"] as! Int
            let s = try scheduler(of: c)
            let what = "\(name) steps=\(steps) shift=\(s.shift) N=\(s.numTrainTimesteps) " +
                       "terminal=\(String(describing: s.shiftTerminal))"
            XCTAssertEqual(s.name, name, what)
            XCTAssertEqual(s.shiftTerminal,
                           c["shift_terminal"] is NSNull ? nil : number(c["shift_terminal"]), what)
            let given = c["given"] as? [Any]
            let (sigmas, times) = s.schedule(steps: steps, given: given?.map(number))
            XCTAssertEqual(sigmas, floats(c["sigmas"]), "\(what) sigmas")
            XCTAssertEqual(times, floats(c["model_times"]), "\(what) model times")
            XCTAssertEqual(sigmas.count, steps + 1, what)
            XCTAssertEqual(times.count, steps, what)

            // a scheduler without a re-planned tail leaps in one jump: its cases hold none
            let tail = c["tail"] as? [String: Any]
            XCTAssertEqual(tail == nil, !s.leapTail, "\(what) tail present")
            if let tail {
                    let (tailSigmas, tailTimes) = s.tail(from: Float(number(tail["t_from"])),
                                                         min: Float(number(tail["t_min"])),
                                                     steps: tail["steps"] as! Int)
                XCTAssertEqual(tailSigmas, floats(tail["sigmas"]), "\(what) tail sigmas")
                XCTAssertEqual(tailTimes, floats(tail["model_times"]), "\(what) tail model times")
            }

            let jump = c["jump"] as! [String: Any]
            let x = tensor(c["x"]!), v = tensor(c["v"]!)
            let got = s.jump(x: x, v: v.item(0).reshaped(x.shape),
                             sigma: Float(number(jump["sigma"])))
            XCTAssertEqual(got.shape, x.shape, what)
            XCTAssertEqual(got.data, floats(jump["x"]), "\(what) jump")
        }
    }

    func testSolverSteps() throws {
        var worst = 0.0
        for c in try cases() {
            let name = c["scheduler"] as! String
            let steps = c["steps"] as! Int
            let s = try scheduler(of: c)
            let v = tensor(c["v"]!)
            var x = tensor(c["x"]!)
            let want = (c["solver_steps"] as! [Any]).map(tensor)
            XCTAssertEqual(want.count, steps)
            let given = (c["given"] as? [Any])?.map(number)
            let solver = s.solver(sigmas: s.schedule(steps: steps, given: given).sigmas)
            for i in 0..<steps {
                let what = "\(name) steps=\(steps) step \(i)"
                x = solver.step(v: v.item(i).reshaped(x.shape), i: i, x: x)
                XCTAssertEqual(x.shape, want[i].shape, what)
                if name == FlowUniPC.name {
                    assertClose(x.data.map(Double.init), want[i].data.map(Double.init),
                                UniPCFixtureTests.latentTolerance, what)
                    for (g, w) in zip(x.data, want[i].data) {
                        worst = max(worst, abs(Double(g) - Double(w)) / max(1, abs(Double(w))))
                    }
                } else {
                    XCTAssertEqual(x.data, want[i].data, what)
                }
            }
        }
        print("scheduler fixture solver steps: largest " +
              "flow_unipc difference \(worst) (of max(1, |x|))")
    }
}

final class SchedulersTests: XCTestCase {
    func testRegistry() throws {
        // edge/core/schedulers.py SCHEDULERS, in its order
        XCTAssertEqual(schedulers.map(\.name),
                       ["flow_euler", "flow_unipc", "cogvideox_ddim", "ltx_flow_euler", "rflow"])
        XCTAssertEqual(knownSchedulers,
                       ["flow_euler", "flow_unipc", "cogvideox_ddim", "ltx_flow_euler", "rflow"])
        XCTAssertTrue(schedulers[0].type == FlowEuler.self)
        XCTAssertTrue(schedulers[1].type == FlowUniPC.self)
        XCTAssertTrue(schedulers[2].type == CogVideoXDDIM.self)
        XCTAssertTrue(schedulers[3].type == FlowEulerLTX.self)
        XCTAssertTrue(schedulers[4].type == RFlow.self)
        // Python's class attributes leap_tail and takes_shift_terminal
        XCTAssertEqual(schedulers.map { $0.type.leapTail }, [true, true, false, true, true])
        XCTAssertEqual(schedulers.map { $0.type.takesShiftTerminal },
                       [false, false, false, true, false])
        for (name, type) in schedulers {
            XCTAssertEqual(type.name, name)
            let s = try scheduler(named: name, shift: 2.5, numTrainTimesteps: 500)
            XCTAssertTrue(Swift.type(of: s) == type, name)
            XCTAssertEqual(s.name, name)
            XCTAssertEqual(s.shift, 2.5)
            XCTAssertEqual(s.numTrainTimesteps, 500)
        }
        XCTAssertTrue(try scheduler(named: "flow_euler", shift: 3, numTrainTimesteps: 1000)
            .solver(sigmas: [1, 0]) is EulerSolver)
        XCTAssertTrue(try scheduler(named: "flow_unipc", shift: 3, numTrainTimesteps: 1000)
            .solver(sigmas: [1, 0]) is UniPCFlow)
        XCTAssertTrue(try scheduler(named: "cogvideox_ddim", shift: 3, numTrainTimesteps: 1000)
            .solver(sigmas: [999, -1]) is DDIMSolver)
        XCTAssertTrue(try scheduler(named: "ltx_flow_euler", shift: 3, numTrainTimesteps: 1000)
            .solver(sigmas: [1, 0]) is EulerSolver)
        XCTAssertTrue(try scheduler(named: "rflow", shift: 0.5, numTrainTimesteps: 1000)
            .solver(sigmas: [1, 0]) is EulerSolver)
        // the terminal reaches the scheduler that takes one; nil by default
        XCTAssertEqual(try scheduler(named: "ltx_flow_euler", shift: 3, numTrainTimesteps: 1000,
                                     shiftTerminal: 0.1).shiftTerminal, 0.1)
        XCTAssertNil(
            try scheduler(named: "ltx_flow_euler", shift: 3, numTrainTimesteps: 1000).shiftTerminal)
    }

    func testRefusesAnUnknownName() {
        for name in ["ddim", "flow_euler_x", "", "FLOW_EULER"] {
            XCTAssertThrowsError(
                try scheduler(named: name, shift: 3, numTrainTimesteps: 1000)) { error in
                // the message edge/core/schedulers.py's scheduler_for gives
                XCTAssertEqual("\(error)", "sampler setting scheduler='\(name)': " +
                                           "known: flow_euler, flow_unipc, " +
                                           "cogvideox_ddim, ltx_flow_euler, rflow")
            }
        }
        XCTAssertThrowsError(
            try scheduler(named: "it's", shift: 3, numTrainTimesteps: 1000)) { error in
            XCTAssertEqual("\(error)", "sampler setting scheduler=\"it's\": known: flow_euler, " +
                                       "flow_unipc, cogvideox_ddim, ltx_flow_euler, rflow")
        }
    }

    func testSettingsFunctionsGoThroughTheScheduler() throws {
        for name in knownSchedulers {
            var settings = SamplerSettings()
            settings.scheduler = name
            settings.steps = 9
            settings.shift = 5
            settings.leapSteps = 3
            let s = scheduler(of: settings)
            XCTAssertEqual(s.name, name)
            let (sigmas, times) = s.schedule(steps: 9)
            XCTAssertEqual(timesteps(settings), sigmas, name)
            XCTAssertEqual(modelTimes(settings), times, name)
            guard s.leapTail else {  // such settings are refused (testRefusesLeapStepsWithoutATail)
                XCTAssertThrowsError(try settings.validate(), name)
                continue
            }
            XCTAssertNoThrow(try settings.validate(), name)
            let tail = scheduler(of: settings).tail(from: sigmas[4], min: sigmas[8], steps: 3)
            let want = s.tail(from: sigmas[4], min: sigmas[8], steps: 3)
            XCTAssertEqual(tail.sigmas, want.sigmas, name)
            XCTAssertEqual(tail.modelTimes, want.modelTimes, name)
        }
    }

    func testJumpLandsOnThePredictedX0() throws {
        let x = Tensor(shape: [1, 3], data: [0.3, -1.2, 2.5]),
            v = Tensor(shape: [1, 3], data: [0.7, -0.1, 1.9])
        for name in knownSchedulers where name != CogVideoXDDIM.name {
            let s = try scheduler(named: name, shift: 3, numTrainTimesteps: 1000)
            XCTAssertEqual(s.jump(x: x, v: v, sigma: 0.625).data,
                           zip(x.data, v.data).map { $0 + (0 - 0.625) * $1 })
        }
        // DDIM: x0 = sqrt(a) x - sqrt(1 - a) v at the level's alphas_cumprod
        let ddim = CogVideoXDDIM(shift: 3, numTrainTimesteps: 1000)
        for level: Float in [999, 570, 0] {
            let a = ddim.alphasCumprod[Int(level)]
            let c = Float(a.squareRoot()), d = Float((1 - a).squareRoot())
            XCTAssertEqual(ddim.jump(x: x, v: v, sigma: level).data,
                           zip(x.data, v.data).map { c * $0 - d * $1 })
        }
        // the last training step has zero SNR: its x0 is -v
        XCTAssertEqual(ddim.jump(x: x, v: v, sigma: 999).data, v.data.map { -$0 })
    }

    func testDDIMSchedule() {
        // zero terminal SNR, the first level kept; falling in between
        for (shift, n) in [(1.0, 1000), (3.0, 1000), (2.5, 500)] {
            let s = CogVideoXDDIM(shift: shift, numTrainTimesteps: n)
            XCTAssertEqual(s.alphasCumprod.count, n)
            XCTAssertEqual(s.alphasCumprod.last, 0)
            XCTAssertTrue(zip(s.alphasCumprod, s.alphasCumprod.dropFirst()).allSatisfy { $0 > $1 })
        }
        // trailing timesteps: round(arange(N, 0, -N / steps)) - 1, then -1; times t / N
        let s = CogVideoXDDIM(shift: 1, numTrainTimesteps: 1000)
        XCTAssertEqual(s.timesteps(steps: 4), [999, 749, 499, 249])
        XCTAssertEqual(s.schedule(steps: 4).sigmas, [999, 749, 499, 249, -1])
        XCTAssertEqual(s.schedule(steps: 4).modelTimes,
                       [0.999, 0.749, 0.499, 0.249].map { Float($0 as Double) })
        XCTAssertEqual(s.timesteps(steps: 7), [999, 856, 713, 570, 428, 285, 142])
        // N / steps whole: the stride of 7 steps is 142, so a step need not land on the next
        XCTAssertEqual((s.solver(sigmas: s.schedule(steps: 7).sigmas) as! DDIMSolver).stride, 142)
    }

    func testShiftTerminalIsCheckedAsPythonChecksIt() throws {
        // SamplerSettings' messages (edge/core/sampler.py), naming the field
        let range = "must be a number between 0 and 1 (the last " +
                    "noise level before 0), or None for no stretch"
        for value in [1.5, -0.25, 0.0, 1.0] {
            XCTAssertThrowsError(try Fixtures.settings(["scheduler": "ltx_flow_euler",
                                                        "shift_terminal": value])) { error in
                XCTAssertEqual("\(error)", "sampler setting shift_terminal=\(value): \(range)")
            }
        }
        for name in ["flow_euler", "flow_unipc", "cogvideox_ddim"] {
            XCTAssertThrowsError(
                try Fixtures.settings(["scheduler": name, "shift_terminal": 0.5])) { error in
                XCTAssertEqual("\(error)",
                               "sampler setting shift_terminal=0.5: \(name) takes none (only "
                               + "ltx_flow_euler stretches its schedule to a terminal level)")
            }
        }
        // null and a missing field (packages before it): no stretch
        XCTAssertNil(try Fixtures.settings(["scheduler": "flow_euler", "shift_terminal": NSNull()])
            .shiftTerminal)
        XCTAssertNil(try Fixtures.settings(["steps": 4]).shiftTerminal)
        let ltx = try Fixtures.settings(["scheduler": "ltx_flow_euler", "shift": 2.5, "steps": 12,
                                         "shift_terminal": 0.1])
        XCTAssertEqual(ltx.shiftTerminal, 0.1)
        let sigmas = timesteps(ltx)
        XCTAssertEqual(sigmas, FlowEulerLTX(shift: 2.5, numTrainTimesteps: 1000,
                                            shiftTerminal: 0.1).schedule(steps: 12).sigmas)
        XCTAssertEqual(sigmas.first, 1)
        XCTAssertEqual(Double(sigmas[11]), 0.1, accuracy: 1e-6)
        XCTAssertEqual(sigmas.last, 0)
        var settings = ltx
        settings.scheduler = "flow_euler"
        XCTAssertThrowsError(try settings.validate())
        settings.shiftTerminal = nil
        XCTAssertNoThrow(try settings.validate())
    }

    func testRefusesSettingsThatMakeNoScheduleOrAHugeGuidance() throws {
        // what edge/core/options.py check_settings refuses (the third probe's item 13): the
        // runtime returned a NaN video for the first two, a video of overflow for the third
        XCTAssertNoThrow(try SamplerSettings().validate())
        var tiny = SamplerSettings()
        tiny.shift = 1e-300
        XCTAssertThrowsError(try tiny.validate()) { error in
            XCTAssertTrue("\(error)".hasPrefix("sampler settings shift=1e-300, "
                                              + "num_train_timesteps=1000: no usable noise "
                                              + "schedule"), "\(error)")
        }
        var one = SamplerSettings()
        one.numTrainTimesteps = 1
        XCTAssertThrowsError(try one.validate())
        var huge = SamplerSettings()
        huge.guidance = 1e300
        XCTAssertThrowsError(try huge.validate()) { error in
            XCTAssertTrue("\(error)".contains("larger than 10000 in size"), "\(error)")
        }
    }

    func testRefusesLeapStepsWithoutATail() throws {
        // the message edge/core/sampler.py's SamplerSettings gives
        var settings = SamplerSettings()
        settings.scheduler = "cogvideox_ddim"
        settings.leapSteps = 3
        XCTAssertThrowsError(try settings.validate()) { error in
            XCTAssertEqual("\(error)",
                           "sampler setting leap_steps=3: cogvideox_ddim leaps in one step "
                           + "only (no re-planned tail is built for it)")
        }
        XCTAssertThrowsError(
            try Fixtures.settings(["scheduler": "cogvideox_ddim", "leap_steps": 2])) { error in
            XCTAssertEqual("\(error)",
                           "sampler setting leap_steps=2: cogvideox_ddim leaps in one step "
                           + "only (no re-planned tail is built for it)")
        }
        settings.leapSteps = 1
        XCTAssertNoThrow(try settings.validate())
        settings.leap = true
        XCTAssertNoThrow(try settings.validate())
        for name in ["flow_euler", "flow_unipc"] {
            settings.scheduler = name
            settings.leapSteps = 3
            XCTAssertNoThrow(try settings.validate(), name)
        }
    }
}
