import EdgeCore
import EdgeRuntime
import Foundation
import XCTest

/// The replay fixtures tests/swift_replay.py writes (run by tests/test_swift_runtime.py,
/// which passes their folder in EDGE_SWIFT_REPLAY): the iphone package, the Python runtime's
/// recorded block calls, and manifests the Python side refuses.
struct ReplayFixtures {
    struct Ref { let dtype: String; let shape: [Int]; let offset: Int }
    struct Call { let key: String; let inputs: [String: Ref]; let outputs: [String: Ref] }
    struct Case {
        let name: String, prompt: String
        let settings: [String: Any]
        let latents: Ref, frames: Ref
        let trace: [String: Any]
        let calls: [Call]
    }

    let folder: URL
    let cases: [Case]
    let tensors: Data
    var package: URL { folder.appendingPathComponent("package") }

    static func load() throws -> ReplayFixtures {
        guard let path = ProcessInfo.processInfo.environment["EDGE_SWIFT_REPLAY"] else {
            throw XCTSkip("EDGE_SWIFT_REPLAY is not set: `pytest " +
                          "tests/test_swift_runtime.py` writes the replay fixtures " +
                          "(they need the Python runtime) and runs these tests with it")
        }
        let folder = URL(fileURLWithPath: path)
        let replay = folder.appendingPathComponent("replay")
        let raw = try JSONSerialization.jsonObject(
            with: Data(contentsOf: replay.appendingPathComponent("cases.json"))) as! [[String: Any]]
        func ref(_ v: Any?) -> Ref {
            let d = v as! [String: Any]
            return Ref(dtype: d["dtype"] as! String,
                       shape: (d["shape"] as! [NSNumber]).map(\.intValue),
                       offset: (d["offset"] as! NSNumber).intValue)
        }
        func refs(_ v: Any?) -> [String: Ref] { (v as! [String: Any]).mapValues(ref) }
        let cases = raw.map { c in
            Case(name: c["name"] as! String, prompt: c["prompt"] as! String,
                 settings: c["settings"] as! [String: Any], latents: ref(c["latents"]),
                 frames: ref(c["frames"]),
                 trace: c["trace"] as! [String: Any],
                 calls: (c["calls"] as! [[String: Any]]).map {
                     Call(key: $0["key"] as! String, inputs: refs($0["inputs"]),
                          outputs: refs($0["outputs"]))
                 })
        }
        return ReplayFixtures(folder: folder, cases: cases,
                              tensors: try Data(
                                contentsOf: replay.appendingPathComponent("tensors.bin"),
                                options: .alwaysMapped))
    }

    func tensor(_ ref: Ref) -> Tensor {
        Tensor(littleEndian: tensors, dtype: ref.dtype, shape: ref.shape, offset: ref.offset)
    }

    /// A case's sampler overrides applied to the package's settings, through the settings'
    /// own decoding (snake_case keys, unknown keys refused, values validated).
    func configure(_ c: Case) -> (inout SamplerSettings) -> Void {
        return { settings in
            let encoder = JSONEncoder()
            encoder.keyEncodingStrategy = .convertToSnakeCase
            var merged = try! JSONSerialization.jsonObject(with: encoder.encode(settings))
                as! [String: Any]
            merged.merge(c.settings) { $1 }
            settings = try! ManifestReader.jsonDecoder().decode(
                SamplerSettings.self, from: JSONSerialization.data(withJSONObject: merged))
        }
    }
}

/// Plays one recorded case back: each block call must ask for the recorded block with the
/// recorded inputs (within 1e-5, relative to values above 1); it gets the recorded outputs.
final class ReplayPlayer {
    let fixtures: ReplayFixtures
    private(set) var calls: [ReplayFixtures.Call] = []
    private(set) var next = 0
    private(set) var worstInputError = 0.0
    private let lock = NSLock()

    init(_ fixtures: ReplayFixtures) { self.fixtures = fixtures }

    func start(_ c: ReplayFixtures.Case) { lock.lock(); calls = c.calls; next = 0; lock.unlock() }
    var finished: Bool { next == calls.count }

    func answer(_ key: String, _ inputs: [String: Tensor]) throws -> [String: Tensor] {
        lock.lock(); defer { lock.unlock() }
        guard next < calls.count else {
            throw RuntimeError.block("replay: call \(next) to \(key), but " +
                                     "Python made only \(calls.count) calls")
        }
        let call = calls[next]
        guard call.key == key else {
            throw RuntimeError.block("replay: call \(next) went to \(key); " +
                                     "Python's went to \(call.key)")
        }
        guard Set(inputs.keys) == Set(call.inputs.keys) else {
            throw RuntimeError.block("replay: call \(next) to \(key) " +
                                     "fed \(inputs.keys.sorted()); Python " +
                                     "fed \(call.inputs.keys.sorted())")
        }
        for (name, ref) in call.inputs {
            let want = fixtures.tensor(ref), got = inputs[name]!
            guard got.shape == want.shape else {
                throw RuntimeError.block("replay: call \(next) to \(key): input \(name) " +
                                         "of shape \(got.shape); Python's was \(want.shape)")
            }
            let worst = relativeDifference(got, want)
            if !(worst <= 1e-5) {  // NaN too
                throw RuntimeError.block("replay: call \(next) to \(key): input \(name) " +
                                         "differs from Python's by \(worst)")
            }
            worstInputError = max(worstInputError, worst)
        }
        next += 1
        return call.outputs.mapValues(fixtures.tensor)
    }
}

/// A backend whose blocks answer from a ReplayPlayer. Loading reads nothing but is counted.
final class ReplayBackend: BlockBackend {
    let player: ReplayPlayer
    private(set) var loads: [String] = []
    private let lock = NSLock()

    init(_ player: ReplayPlayer) { self.player = player }

    func load(_ entry: BlockEntry) throws -> LoadedBlock {
        lock.lock(); loads.append(entry.key); lock.unlock()
        return ReplayBlock(key: entry.key, player: player)
    }
}

final class ReplayBlock: LoadedBlock {
    let key: String
    let player: ReplayPlayer
    init(key: String, player: ReplayPlayer) { self.key = key; self.player = player }
    func predict(_ inputs: [String: Tensor]) throws -> [String: Tensor] {
        try player.answer(key, inputs)
    }
}

/// A test case with a scratch folder of its own (removed afterwards) and a check that an
/// error names what it must.
class ScratchTestCase: XCTestCase {
    var scratch: URL!

    override func setUpWithError() throws {
        scratch = FileManager.default.temporaryDirectory.appendingPathComponent(
            "edge-swift-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: scratch) }

    /// Each manifest in `file` (bad_manifests.json, written by tests/swift_replay.py) that the
    /// Python side refuses is refused here too, both messages naming the case's words; returns
    /// how many there were.
    @discardableResult
    func assertRefusesWhatPythonRefuses(_ file: URL) throws -> Int {
        let cases = try JSONSerialization.jsonObject(with: Data(contentsOf: file))
            as! [[String: Any]]
        for c in cases {
            let name = c["name"] as! String, words = c["names"] as! [String]
            let python = c["python_error"] as! String
            for word in words {
                XCTAssertTrue(python.contains(word), "\(name): Python's " +
                                                     "\"\(python)\" lacks \(word)")
            }
            let data = try JSONSerialization.data(withJSONObject: c["manifest"]!)
            try assertRefused(name, words) { _ = try ManifestReader.decode(data) }
        }
        return cases.count
    }

    /// `body` must throw an error naming every word. An XCTSkip it throws (its fixtures are
    /// missing) skips the test instead of standing in for the refusal.
    func assertRefused(_ what: String, _ words: [String], _ body: () throws -> Void,
                       file: StaticString = #filePath, line: UInt = #line) throws {
        do {
            try body()
            XCTFail("\(what): nothing was refused", file: file, line: line)
        } catch let skip as XCTSkip {
            throw skip
        } catch {
            for word in words {
                XCTAssertTrue("\(error)".contains(word), "\(what): \"\(error)\" does " +
                    "not name \(word)", file: file, line: line)
            }
        }
    }
}
