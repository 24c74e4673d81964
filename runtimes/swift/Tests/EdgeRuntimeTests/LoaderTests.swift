import EdgeCore
@testable import EdgeRuntime
import Foundation
import XCTest

/// A backend whose blocks count themselves while alive, so a test sees what is really held.
final class CountingBackend: BlockBackend {
    private let lock = NSLock()
    private(set) var liveBytes = 0
    private(set) var peakLiveBytes = 0
    private(set) var events: [String] = []
    let loadDelay: TimeInterval, runDelay: TimeInterval

    init(loadDelay: TimeInterval = 0, runDelay: TimeInterval = 0) {
        self.loadDelay = loadDelay; self.runDelay = runDelay
    }

    func note(_ event: String, bytes: Int = 0) {
        lock.lock()
        events.append(event)
        liveBytes += bytes
        peakLiveBytes = max(peakLiveBytes, liveBytes)
        lock.unlock()
    }

    func load(_ entry: BlockEntry) throws -> LoadedBlock {
        note("load-start \(entry.key)")
        Thread.sleep(forTimeInterval: loadDelay)
        let block = CountedBlock(entry, self)
        note("load-end \(entry.key)", bytes: entry.weightBytes)
        return block
    }
}

final class CountedBlock: LoadedBlock {
    let entry: BlockEntry
    weak var backend: CountingBackend?
    init(_ entry: BlockEntry, _ backend: CountingBackend) {
        self.entry = entry
        self.backend = backend
    }
    deinit { backend?.note("freed \(entry.key)", bytes: -entry.weightBytes) }

    func predict(_ inputs: [String: Tensor]) throws -> [String: Tensor] {
        backend?.note("run-start \(entry.key)")
        Thread.sleep(forTimeInterval: backend?.runDelay ?? 0)
        backend?.note("run-end \(entry.key)")
        return [:]
    }
}

final class LoaderTests: XCTestCase {
    static let empty = try! ManifestReader.jsonDecoder().decode(Manifest.Block.self, from: Data("""
        {"name": "b", "model": "b.mlpackage", "files": [], "weights": {"path": "w"}, \
        "weight_bytes": 0,
         "inputs": [], "outputs": []}
        """.utf8))

    func entries(_ sizes: [(String, Int)], files: [String: [URL]] = [:]) -> [BlockEntry] {
        sizes.map { key, bytes in
            BlockEntry(key: key, block: Self.empty, program: URL(fileURLWithPath: "/tmp/\(key)"),
                       files: files[key] ?? [], weightBytes: bytes, digest: key)
        }
    }

    /// Runs `schedule` as the pipeline does: this key's load first, the next key's prefetched
    /// behind it, wait for this one, run, done.
    func run(_ loader: BlockLoader, _ schedule: [String]) throws {
        for (i, key) in schedule.enumerated() {
            loader.prefetch(key)
            if i + 1 < schedule.count { loader.prefetch(schedule[i + 1]) }
            _ = try loader.block(key).predict([:])
            loader.done(key)
        }
    }

    func testTheBudgetIsNeverExceeded() throws {
        var generator = SystemRandomNumberGenerator()
        let sizes = (0..<12).map { ("c/b\($0)", Int.random(in: 1...100, using: &generator) * 1000) }
        let budget = 250_000
        let backend = CountingBackend(loadDelay: 0.002, runDelay: 0.001)
        let loader = try BlockLoader(entries: entries(sizes), backend: backend, budget: budget,
                                     everyStep: ["c/b0", "c/b1"])
        let keys = sizes.map(\.0)
        let schedule = (0..<40).map { _ in keys.randomElement(using: &generator)! } + keys + keys
        try run(loader, schedule)
        loader.settle()
        XCTAssertLessThanOrEqual(loader.stats.peakBytes, budget)
        XCTAssertLessThanOrEqual(backend.peakLiveBytes, budget, "blocks alive at once exceeded " +
            "the budget")
        XCTAssertLessThanOrEqual(loader.residentBytes, budget)
    }

    func testPrefetchLoadsTheNextBlockWhileTheCurrentOneRuns() throws {
        let keys = (0..<6).map { "c/b\($0)" }
        let backend = CountingBackend(loadDelay: 0.01, runDelay: 0.05)
        // room for two blocks: nothing pinned, one running and one prefetched
        let loader = try BlockLoader(entries: entries(keys.map { ($0, 1000) }), backend: backend,
                                     budget: 2000)
        XCTAssertEqual(loader.pinned, [])
        try run(loader, keys + keys)
        XCTAssertEqual(loader.stats.loadOrder, keys + keys, "loads follow the schedule")
        XCTAssertLessThanOrEqual(backend.peakLiveBytes, 2000)
        for i in 1..<keys.count {   // b(i) starts loading before b(i-1) finished running
            let load = backend.events.firstIndex(of: "load-start \(keys[i])")!
            let ran = backend.events.firstIndex(of: "run-end \(keys[i - 1])")!
            XCTAssertLessThan(load, ran, "\(keys[i]) was not prefetched during \(keys[i - 1])")
        }
    }

    func testPinnedBlocksStayAndStreamedOnesAreUnloaded() throws {
        let sizes = [("transformer/a", 100), ("transformer/b", 100), ("vae/big", 300),
                     ("vae/big2", 300),
                     ("vae/small", 50)]
        let backend = CountingBackend()
        let loader = try BlockLoader(entries: entries(sizes), backend: backend, budget: 900,
                                     everyStep: ["transformer/a", "transformer/b"])
        XCTAssertTrue(loader.pinned.isSuperset(of: ["transformer/a", "transformer/b"]))
        XCTAssertEqual(loader.pinned, ["transformer/a", "transformer/b", "vae/small"])
        try run(loader,
                ["transformer/a", "transformer/b", "transformer/a", "transformer/b", "vae/big"])
        loader.settle()
        XCTAssertEqual(loader.stats.loadOrder.filter { $0.hasPrefix("transformer") },
                       ["transformer/a", "transformer/b"],
                       "pinned blocks load once")
        XCTAssertFalse(loader.loadedKeys.contains("vae/big"))
        XCTAssertEqual(backend.events.filter { $0 == "freed vae/big" }.count, 1,
                       "the streamed block was freed")
    }

    func testNoBudgetKeepsEverything() throws {
        let loader = try BlockLoader(entries: entries([("c/a", 10), ("c/b", 20)]),
                                     backend: CountingBackend())
        try run(loader, ["c/a", "c/b", "c/a"])
        XCTAssertEqual(loader.loadedKeys, ["c/a", "c/b"])
        XCTAssertEqual(loader.stats.loads, 2)
    }

    func testABudgetBelowTheLargestBlockIsRefused() {
        XCTAssertThrowsError(try BlockLoader(entries: entries([("c/a", 10), ("c/huge", 5000)]),
                                             backend: CountingBackend(), budget: 4999)) { error in
            guard case RuntimeError.budget(let why) = error else { return XCTFail("\(error)") }
            XCTAssertTrue(why.contains("c/huge") && why.contains("5000"), why)
        }
    }

    func testAFileChangedAfterVerificationIsRefusedByName() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent(
            "edge-loader-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder.appendingPathComponent("b.mlpackage"),
                                                withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let file = folder.appendingPathComponent("b.mlpackage/weight.bin")
        try Data(repeating: 7, count: 4096).write(to: file)
        let entry = BlockEntry(key: "c/b", block: Self.empty,
                               program: folder.appendingPathComponent("b.mlpackage"),
                               files: [file], weightBytes: 4096, digest: "d")
        let loader = try BlockLoader(entries: [entry], backend: CountingBackend(), budget: 8192,
                                     identities: [file.path: FileIdentity.of(file.path)!],
                                     coldReads: true)
        try FileManager.default.removeItem(at: file)
        try Data(repeating: 8, count: 4096).write(to: file)
        XCTAssertThrowsError(try loader.block("c/b")) { error in
            XCTAssertTrue("\(error)".contains("b.mlpackage/weight.bin"), "\(error)")
            XCTAssertTrue("\(error)".contains("changed on disk"), "\(error)")
        }
        XCTAssertEqual(loader.residentBytes, 0, "a refused load holds nothing")
    }
}
