#if canImport(CoreML)
import CoreML
import EdgeCore
import Foundation
#if os(iOS)
import os
#endif

/// Loads and unloads one `MLModel` per block (or block variant) on a background queue.
///
/// - Prefetch: `prefetch(key)` starts loading the next block while the current one runs;
///   `model(key)` waits for that load (or loads now).
/// - Residency: after a block ran, `done(key)` keeps it loaded while the process has room
///   for it plus `reserve` (`os_proc_available_memory()` on iOS; on macOS a fixed budget,
///   as macOS has no per-process limit to ask), else unloads it. The transformer's blocks,
///   used every step, are the ones worth keeping; the Python runtime's loader does the same
///   with an explicit byte budget.
/// - Compilation: an `.mlpackage` is compiled to `.mlmodelc` on the device, once per
///   package file (MLModel.compileModel); the result is cached under Caches/.
public final class BlockLoader {
    public struct Entry {
        public let key: String          // "transformer/pair_0" or "transformer/pair_0#tdtm"
        public let package: URL         // the .mlpackage folder
        public let weightBytes: Int
        public let digest: String       // of its program and weights files (manifest sha256s)

        public init(key: String, package: URL, weightBytes: Int, digest: String) {
            self.key = key; self.package = package; self.weightBytes = weightBytes; self.digest = digest
        }
    }

    private let entries: [String: Entry]
    private let configuration: MLModelConfiguration
    private let queue = DispatchQueue(label: "edge.block-loader", qos: .userInitiated)
    private let lock = NSLock()
    private var loaded: [String: MLModel] = [:]
    private var pending: [String: DispatchGroup] = [:]
    private var failures: [String: Error] = [:]
    private let cacheFolder: URL
    public let reserve: Int
    public let budget: Int?             // a memory budget the app chose (bytes), or none
    public private(set) var loads = 0
    public private(set) var loadSeconds = 0.0

    public init(entries: [Entry], computeUnits: MLComputeUnits, cacheFolder: URL,
                reserve: Int = 200 << 20, budget: Int? = nil) {
        self.entries = Dictionary(uniqueKeysWithValues: entries.map { ($0.key, $0) })
        configuration = MLModelConfiguration()
        configuration.computeUnits = computeUnits
        self.cacheFolder = cacheFolder
        self.reserve = reserve
        self.budget = budget
    }

    /// Bytes the process may still allocate.
    func availableMemory() -> Int {
        #if os(iOS)
        return Int(os_proc_available_memory())
        #else
        return Int(ProcessInfo.processInfo.physicalMemory / 2)
        #endif
    }

    func residentBytes() -> Int {
        lock.lock(); defer { lock.unlock() }
        return loaded.keys.reduce(0) { $0 + (entries[$1]?.weightBytes ?? 0) }
    }

    /// Start loading `key` in the background unless it is loaded or loading.
    public func prefetch(_ key: String) {
        lock.lock()
        defer { lock.unlock() }
        guard loaded[key] == nil, pending[key] == nil, let entry = entries[key] else { return }
        let group = DispatchGroup()
        group.enter()
        pending[key] = group
        queue.async { [self] in
            let started = Date()
            do {
                let model = try MLModel(contentsOf: try compiled(entry), configuration: configuration)
                lock.lock(); loaded[key] = model; lock.unlock()
            } catch {
                lock.lock(); failures[key] = error; lock.unlock()
            }
            lock.lock()
            pending[key] = nil
            loads += 1
            loadSeconds += Date().timeIntervalSince(started)
            lock.unlock()
            group.leave()
        }
    }

    /// The loaded model of `key`, waiting for a prefetch in flight.
    public func model(_ key: String) throws -> MLModel {
        prefetch(key)
        lock.lock()
        let group = pending[key]
        lock.unlock()
        group?.wait()
        lock.lock()
        defer { lock.unlock() }
        if let error = failures.removeValue(forKey: key) { throw error }
        guard let model = loaded[key] else {
            throw ManifestError.invalid("block \(key): not in the package")
        }
        return model
    }

    /// `key` ran: keep it while memory allows, else unload it.
    public func done(_ key: String) {
        let size = entries[key]?.weightBytes ?? 0
        let room = availableMemory() - reserve
        let fitsBudget = budget.map { residentBytes() <= $0 } ?? true
        if size <= room && fitsBudget { return }
        lock.lock(); loaded[key] = nil; lock.unlock()
    }

    public func unloadAll() {
        lock.lock(); loaded.removeAll(); lock.unlock()
    }

    /// `.mlmodelc` of an entry: compiled once, kept in the cache folder under the digest
    /// of its files (a new export compiles anew).
    func compiled(_ entry: Entry) throws -> URL {
        let name = entry.key.replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "#", with: "_")
        let target = cacheFolder.appendingPathComponent("\(name)-\(entry.digest).mlmodelc")
        if FileManager.default.fileExists(atPath: target.path) { return target }
        let temporary = try MLModel.compileModel(at: entry.package)
        try FileManager.default.createDirectory(at: cacheFolder, withIntermediateDirectories: true)
        try? FileManager.default.removeItem(at: target)
        try FileManager.default.moveItem(at: temporary, to: target)
        return target
    }
}
#endif
