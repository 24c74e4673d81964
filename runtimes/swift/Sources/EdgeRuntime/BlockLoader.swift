import EdgeCore
import Foundation

/// Owns the memory that loaded blocks occupy, under an optional byte budget (runtimes/python
/// loader.py, with programs instead of weight buffers):
///
/// - Pins what fits (the blocks run every denoising step first) and streams the rest: a
///   streamed block is loaded when needed and unloaded right after it ran.
/// - Prefetch: `prefetch(key)` loads the next block of the schedule on a background queue
///   while the current one computes, if it fits beside what is loaded; `block(key)` waits for
///   that load, or loads now after unloading streamed blocks to make room. Loaded plus loading
///   bytes never exceed the budget.
/// - Every load first checks that the block's files are the ones verified when the package was
///   opened (size, modification time, inode), and refuses a changed file by name.
/// - With `coldReads`, a block's files are dropped from the page cache before it loads, so a
///   benchmark measures storage, not memory (Linux; see PackageFiles.dropFromPageCache).
public final class BlockLoader {
    public struct Stats: Equatable {
        public var loads = 0
        public var unloads = 0
        public var loadSeconds = 0.0      // inside backend loads, any thread
        public var waitSeconds = 0.0      // compute waiting for a block
        public var peakBytes = 0          // most bytes loaded or loading at once
        public var loadOrder: [String] = []
    }

    public let budget: Int?
    public let pinned: Set<String>
    let entries: [String: BlockEntry]
    let backend: BlockBackend
    let identities: [String: FileIdentity]
    let coldReads: Bool
    private let queue = DispatchQueue(label: "edge.block-loader", qos: .userInitiated)
    private let lock = NSLock()
    private var loaded: [String: LoadedBlock] = [:]
    private var pending: [String: DispatchGroup] = [:]
    private var failures: [String: Error] = [:]
    private var heldBytes = 0             // loaded + loading
    private var _stats = Stats()

    /// `everyStep`: keys run at every denoising step, pinned first. A budget smaller than the
    /// largest block is refused here, before anything loads.
    public init(entries: [BlockEntry], backend: BlockBackend, budget: Int? = nil,
                everyStep: [String] = [], identities: [String: FileIdentity] = [:],
                coldReads: Bool = false) throws {
        self.entries = Dictionary(entries.map { ($0.key, $0) }, uniquingKeysWith: { a, _ in a })
        self.backend = backend
        self.budget = budget
        self.identities = identities
        self.coldReads = coldReads
        pinned = try Self.planPins(entries, budget: budget, everyStep: everyStep)
    }

    /// The keys kept loaded once loaded. Pinning leaves room to stream the largest remaining
    /// block plus one prefetched block; every-step blocks are considered first, in order.
    static func planPins(_ entries: [BlockEntry], budget: Int?,
                         everyStep: [String]) throws -> Set<String> {
        guard let largest = entries.max(by: { $0.weightBytes < $1.weightBytes }) else { return [] }
        guard let budget else { return Set(entries.map(\.key)) }
        if budget < largest.weightBytes {
            throw RuntimeError.budget("memory budget \(budget) bytes is smaller than " +
                                      "block \(largest.key) (\(largest.weightBytes) bytes); the " +
                                      "smallest budget that works is \(largest.weightBytes) bytes")
        }
        let sizes = Dictionary(entries.map { ($0.key, $0.weightBytes) },
                               uniquingKeysWith: { a, _ in a })
        let first = everyStep.filter { sizes[$0] != nil }
        let order = first + entries.map(\.key).filter { !first.contains($0) }
        var pins = Set<String>(), pinnedBytes = 0
        for key in order {
            let rest = order.filter { $0 != key && !pins.contains($0) }.compactMap { sizes[$0] }
            let streaming = 2 * (rest.max() ?? 0)   // one running, one prefetched
            if pinnedBytes + sizes[key]! + streaming <= budget {
                pins.insert(key)
                pinnedBytes += sizes[key]!
            }
        }
        return pins
    }

    public var stats: Stats { lock.lock(); defer { lock.unlock() }; return _stats }
    public var loadedKeys: Set<String> {
        lock.lock()
        defer { lock.unlock() }
        return Set(loaded.keys)
    }
    public var residentBytes: Int { lock.lock(); defer { lock.unlock() }; return heldBytes }

    private func fits(_ bytes: Int) -> Bool { budget.map { heldBytes + bytes <= $0 } ?? true }

    /// Start loading `key` in the background, unless it is loaded, loading, unknown, or would
    /// not fit beside what is held now (then `block(key)` loads it when it is needed).
    public func prefetch(_ key: String) {
        lock.lock(); defer { lock.unlock() }
        guard loaded[key] == nil, pending[key] == nil, failures[key] == nil,
              let entry = entries[key], fits(entry.weightBytes) else { return }
        startLoad(entry)
    }

    /// Called with the lock held: reserve the bytes and load on the queue.
    private func startLoad(_ entry: BlockEntry) {
        let group = DispatchGroup()
        group.enter()
        pending[entry.key] = group
        heldBytes += entry.weightBytes
        _stats.peakBytes = max(_stats.peakBytes, heldBytes)
        _stats.loadOrder.append(entry.key)
        queue.async { [self] in
            // a function of its own, so no reference to the block outlives it: once the
            // group is left, an unloaded block is freed at once
            finishLoad(entry)
            group.leave()
        }
    }

    private func finishLoad(_ entry: BlockEntry) {
        let started = Date()
        let result = Result { try load(entry) }
        lock.lock()
        pending[entry.key] = nil
        switch result {
        case .success(let block): loaded[entry.key] = block
        case .failure(let error): failures[entry.key] = error; heldBytes -= entry.weightBytes
        }
        _stats.loads += 1
        _stats.loadSeconds += Date().timeIntervalSince(started)
        lock.unlock()
    }

    private func load(_ entry: BlockEntry) throws -> LoadedBlock {
        for (url, name) in zip(entry.files, entry.paths) {
            try PackageFiles.checkUnchanged(url, identities[url.path], shownAs: name)
            if coldReads { PackageFiles.dropFromPageCache(url) }
        }
        return try backend.load(entry)
    }

    /// The loaded block of `key`: waits for a load in flight, or makes room under the budget
    /// (unloading streamed blocks, waiting for other loads to land) and loads it now.
    public func block(_ key: String) throws -> LoadedBlock {
        guard let entry = entries[key] else {
            throw RuntimeError.block("block \(key): not in the package")
        }
        let started = Date()
        defer {
            lock.lock()
            _stats.waitSeconds += Date().timeIntervalSince(started)
            lock.unlock()
        }
        while true {
            lock.lock()
            if let error = failures.removeValue(forKey: key) { lock.unlock(); throw error }
            if let block = loaded[key] { lock.unlock(); return block }
            if let group = pending[key] { lock.unlock(); group.wait(); continue }
            for other in Array(loaded.keys)
            where !pinned.contains(other) && !fits(entry.weightBytes) {
                evict(other)
            }
            if fits(entry.weightBytes) { startLoad(entry); lock.unlock(); continue }
            // what is still loading holds the room: wait for it to land, then evict it
            let inFlight = Array(pending.values)
            lock.unlock()
            if inFlight.isEmpty {
                throw RuntimeError.budget("block \(key) (\(entry.weightBytes) bytes) does " +
                                          "not fit beside the pinned blocks under the budget")
            }
            inFlight.forEach { $0.wait() }
        }
    }

    /// Called with the lock held.
    private func evict(_ key: String) {
        guard loaded.removeValue(forKey: key) != nil, let entry = entries[key] else { return }
        heldBytes -= entry.weightBytes
        _stats.unloads += 1
    }

    /// `key` ran: a pinned block stays loaded, a streamed one is unloaded.
    public func done(_ key: String) {
        guard !pinned.contains(key) else { return }
        lock.lock(); evict(key); lock.unlock()
    }

    /// Wait for loads in flight, then unload every block (e.g. on a memory warning).
    public func unloadAll() {
        settle()
        lock.lock()
        for key in Array(loaded.keys) { evict(key) }
        failures.removeAll()
        lock.unlock()
    }

    /// Wait for loads in flight (tests, and before measuring).
    public func settle() {
        lock.lock(); let inFlight = Array(pending.values); lock.unlock()
        inFlight.forEach { $0.wait() }
    }
}
