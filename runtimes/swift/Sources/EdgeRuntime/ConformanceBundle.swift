import EdgeCore
import Foundation

/// A conformance bundle written by `edge record` (edge/core/bundle.py): one generation of a
/// package, every block call's inputs and outputs, the initial latents and the final
/// frames. Checked when opened (format, version, the size and sha256 of tensors.bin, every
/// array inside it) and against a package before it is used (`check(_:)`: the same
/// manifest digest, every call to a block of the package with that block's names and shapes).
public struct ConformanceBundle {
    public struct Ref {
        public let dtype: String      // "float32", "int32" or "uint8"
        public let shape: [Int]
        public let offset: Int        // bytes into tensors.bin
    }

    public struct Call {
        public let key: String        // the loader's key: "component/block" or "...#variant"
        public let inputs: [String: Ref]
        public let outputs: [String: Ref]
    }

    public struct Trace: Equatable {
        public let calls: Int, transformerCalls: Int, mergedCalls: Int
        public let leapAt: Int?
    }

    public let folder: URL
    public let manifestSha256: String
    public let recordedWith: String
    public let prompt: String
    public let negativePrompt: String?
    public let seed: UInt64?          // the recording's seed; nil: it was given latents
    public let latents: Ref, frames: Ref
    public let trace: Trace
    public let calls: [Call]
    let settings: [String: Any]
    let tensors: Data

    var jsonFile: URL { folder.appendingPathComponent("bundle.json") }

    public init(contentsOf folder: URL) throws {
        self.folder = folder
        let json = folder.appendingPathComponent("bundle.json")
        func bad(_ why: String) -> RuntimeError { .package("\(json.path): \(why)") }
        guard let raw = FileManager.default.contents(atPath: json.path) else {
            throw RuntimeError.package("\(json.path): missing; not an edge " +
                                       "bundle folder (edge record writes one)")
        }
        let parsed: Any
        do { parsed = try JSONSerialization.jsonObject(with: raw) } catch {
            throw bad("not valid JSON (\(raw.count) bytes; truncated or altered?)")
        }
        guard let body = parsed as? [String: Any] else {
            throw bad("not a JSON object; not an edge bundle")
        }
        guard body["format"] as? String == "edge-bundle" else {
            throw bad("not an edge bundle (no \"format\": \"edge-bundle\")")
        }
        guard (body["format_version"] as? NSNumber)?.intValue == 1 else {
            throw bad("format_version \(body["format_version"] ?? "missing"); " +
                      "this runtime reads version 1")
        }
        func field<T>(_ name: String, _ type: T.Type) throws -> T {
            guard let value = body[name] as? T else {
                throw bad("missing or malformed field \(name)")
            }
            return value
        }
        func ref(_ value: Any?, _ where: String) throws -> Ref {
            guard let d = value as? [String: Any], let dtype = d["dtype"] as? String,
                  let shape = (d["shape"] as? [NSNumber])?.map(\.intValue),
                  let offset = (d["offset"] as? NSNumber)?.intValue else {
                throw bad("\(`where`): not an array reference")
            }
            return Ref(dtype: dtype, shape: shape, offset: offset)
        }
        let package = try field("package", [String: Any].self)
        guard let digest = package["manifest_sha256"] as? String else {
            throw bad("missing field package.manifest_sha256")
        }
        manifestSha256 = digest
        recordedWith = body["recorded_with"] as? String ?? "?"
        prompt = try field("prompt", String.self)
        negativePrompt = body["negative_prompt"] as? String
        switch body["seed"] {   // a seed is drawn again here (run(_:)): 0 to 2^63 - 1
        case nil, is NSNull: seed = nil
        case let number as NSNumber:
            do { seed = try TorchNoise.seed(parsing: number.stringValue) } catch {
                throw bad("\(error)")
            }
        default: throw bad("seed must be a whole number from 0 to 2^63 - 1 or null")
        }
        settings = try field("settings", [String: Any].self)
        latents = try ref(body["latents"], "latents")
        frames = try ref(body["frames"], "frames")
        let t = try field("trace", [String: Any].self)
        trace = Trace(calls: (t["calls"] as? NSNumber)?.intValue ?? -1,
                      transformerCalls: (t["transformer_calls"] as? NSNumber)?.intValue ?? -1,
                      mergedCalls: (t["merged_calls"] as? NSNumber)?.intValue ?? -1,
                      leapAt: (t["leap_at"] as? NSNumber)?.intValue)
        calls = try field("calls", [[String: Any]].self).enumerated().map { i, c in
            guard let key = c["key"] as? String, let inputs = c["inputs"] as? [String: Any],
                  let outputs = c["outputs"] as? [String: Any] else {
                      throw bad("call \(i): malformed")
                  }
            return Call(key: key,
                        inputs: try inputs.mapValues { try ref($0, "call \(i) (\(key)) input") },
                        outputs: try outputs.mapValues { try ref($0, "call \(i) (\(key)) output") })
        }
        // the arrays: as large as recorded and the same bytes, before any is read
        let entry = try field("tensors", [String: Any].self)
        let path = try PackageFiles.resolve(folder, entry["path"] as? String ?? "tensors.bin",
                                            "\(json.path): tensors.path", folderKind: "bundle")
        guard let size = (try? FileManager.default.attributesOfItem(atPath: path.path))?[.size]
                as? Int else {
            throw RuntimeError.package("\(path.path): missing; the bundle's arrays are not there")
        }
        guard size == (entry["bytes"] as? NSNumber)?.intValue else {
            throw RuntimeError.package("\(path.path): \(size) bytes, bundle.json " +
                                       "says \(entry["bytes"] ?? "nothing") (a " +
                                       "truncated or changed bundle)")
        }
        tensors = try Data(contentsOf: path, options: .alwaysMapped)
        guard StreamingSHA256.hex(tensors) == entry["sha256"] as? String else {
            throw RuntimeError.package("\(path.path): sha256 differs from " +
                                       "bundle.json's (a changed bundle)")
        }
        let sizes = ["float32": 4, "int32": 4, "uint8": 1]
        func inside(_ r: Ref, _ where: String) throws {
            guard let width = sizes[r.dtype] else { throw bad("\(`where`): dtype \(r.dtype)") }
            // overflow-safe: a shape's byte count is bounded by the file before any use
            guard r.offset >= 0, r.offset <= tensors.count,
                  let count = checkedCount(r.shape, width: width,
                                           limit: tensors.count - r.offset) else {
                throw bad("\(`where`): shape \(r.shape) of \(r.dtype) at byte \(r.offset) " +
                          "lies outside tensors.bin (\(tensors.count) bytes)")
            }
            _ = count
        }
        try inside(latents, "latents")
        try inside(frames, "frames")
        for (i, call) in calls.enumerated() {
            for (name, r) in call.inputs { try inside(r, "call \(i) (\(call.key)) input \(name)") }
            for (name, r) in call.outputs {
                try inside(r, "call \(i) (\(call.key)) output \(name)")
            }
        }
    }

    /// An array as float32 (ids and bytes are exact in float32).
    public func tensor(_ ref: Ref) -> Tensor {
        Tensor(littleEndian: tensors, dtype: ref.dtype, shape: ref.shape, offset: ref.offset)
    }

    /// The package's sampler settings as the recording ran them (the bundle lists every field).
    public func configure(_ settings: inout SamplerSettings) throws {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        var merged = try JSONSerialization.jsonObject(with: encoder.encode(settings))
            as! [String: Any]
        merged.merge(self.settings) { $1 }
        do {
            settings = try ManifestReader.jsonDecoder().decode(
                SamplerSettings.self, from: JSONSerialization.data(withJSONObject: merged))
        } catch {
            throw RuntimeError.package("\(jsonFile.path): settings: \(error)")
        }
    }

    /// Refuse a bundle of another package, or one whose calls are not calls of this
    /// package's blocks (an unknown key, other input or output names, other shapes).
    public func check(_ manifest: Manifest) throws {
        guard manifestSha256 == manifest.manifestSha256 else {
            throw RuntimeError.package("\(jsonFile.path): recorded from the package with " +
                                       "manifest digest \(manifestSha256.prefix(16))…; this " +
                                       "package's is \(manifest.manifestSha256.prefix(16))… " +
                                       "(record the bundle from this package)")
        }
        var blocks: [String: Manifest.Block] = [:]
        for comp in manifest.components {
            for block in comp.blocks {
                blocks["\(comp.name)/\(block.name)"] = block
                for name in (block.variants ?? [:]).keys {
                    blocks["\(comp.name)/\(block.name)#\(name)"] = block.running(name)
                }
            }
        }
        let shape = [1] + manifest.latentShape
        guard latents.shape == shape else {
            throw RuntimeError.package("\(jsonFile.path): latents of " +
                                       "shape \(latents.shape); the package takes \(shape)")
        }
        for (i, call) in calls.enumerated() {
            guard let block = blocks[call.key] else {
                throw RuntimeError.package("\(jsonFile.path): call \(i) runs \(call.key), " +
                                           "which is no block of this package")
            }
            for (side, refs, sigs) in [("inputs", call.inputs, block.inputs),
                                       ("outputs", call.outputs, block.outputs)] {
                let want = Dictionary(uniqueKeysWithValues: sigs.map { ($0.name, $0.shape) })
                guard Set(refs.keys) == Set(want.keys) else {
                    throw RuntimeError.package("\(jsonFile.path): call \(i) (\(call.key)) " +
                                               "has \(side) \(refs.keys.sorted()); the " +
                                               "block's are \(want.keys.sorted())")
                }
                for (name, r) in refs where r.shape != want[name] {
                    throw RuntimeError.package("\(jsonFile.path): call \(i) " +
                                               "(\(call.key)) \(side.dropLast()) \(name) has " +
                                               "shape \(r.shape); the block's is \(want[name]!)")
                }
            }
        }
    }
}

/// Answers block calls from a bundle, in order: each call must go to the recorded block with
/// inputs equal to the recorded ones (within `tolerance`, relative to values above 1), and
/// gets the recorded outputs. What the Swift pipeline computes around the blocks (tokens,
/// captions, the sampler's latents, the decoder's pieces and state) is checked that way.
public final class BundleReplay: BlockBackend {
    public let bundle: ConformanceBundle
    public let tolerance: Double
    public private(set) var next = 0
    public private(set) var worstInputDifference = 0.0
    public private(set) var worstInputCall: String?
    private let lock = NSLock()

    public init(_ bundle: ConformanceBundle, tolerance: Double = 1e-5) {
        self.bundle = bundle
        self.tolerance = tolerance
    }

    public var finished: Bool { next == bundle.calls.count }

    /// Back to the first call (for another run of the same generation).
    public func rewind() {
        lock.lock()
        next = 0
        worstInputDifference = 0
        worstInputCall = nil
        lock.unlock()
    }

    public func load(_ entry: BlockEntry) throws -> LoadedBlock {
        ReplayedBlock(key: entry.key, replay: self)
    }

    func answer(_ key: String, _ inputs: [String: Tensor]) throws -> [String: Tensor] {
        lock.lock(); defer { lock.unlock() }
        let file = bundle.jsonFile.path
        guard next < bundle.calls.count else {
            throw RuntimeError.block("\(file): call \(next) to \(key), but the " +
                                     "recording made only \(bundle.calls.count) calls")
        }
        let call = bundle.calls[next]
        guard call.key == key else {
            throw RuntimeError.block("\(file): call \(next) went to \(key); " +
                                     "the recording's went to \(call.key)")
        }
        guard Set(inputs.keys) == Set(call.inputs.keys) else {
            throw RuntimeError.block("\(file): call \(next) to \(key) " +
                                     "fed \(inputs.keys.sorted()); the " +
                                     "recording fed \(call.inputs.keys.sorted())")
        }
        for (name, ref) in call.inputs.sorted(by: { $0.key < $1.key }) {
            let want = bundle.tensor(ref), got = inputs[name]!
            guard got.shape == want.shape else {
                throw RuntimeError.block("\(file): call \(next) to \(key): input \(name) of " +
                                         "shape \(got.shape); the recording's was \(want.shape)")
            }
            let worst = relativeDifference(got, want)
            if worst > worstInputDifference {
                worstInputDifference = worst
                worstInputCall = "call \(next) (\(key)) input \(name)"
            }
            if !(worst <= tolerance) {
                throw RuntimeError.block("\(file): call \(next) to \(key): input \(name) differs " +
                                         "from the recording's by \(worst) (> \(tolerance))")
            }
        }
        next += 1
        return call.outputs.mapValues(bundle.tensor)
    }
}

final class ReplayedBlock: LoadedBlock {
    let key: String
    let replay: BundleReplay
    init(key: String, replay: BundleReplay) { self.key = key; self.replay = replay }
    func predict(_ inputs: [String: Tensor]) throws -> [String: Tensor] {
        try replay.answer(key, inputs)
    }
}

/// max |got - want| / max(1, |want|) over the elements where they differ (equal values count
/// none, so an attention bias's -inf against -inf is no difference); NaN where either holds one.
public func relativeDifference(_ got: Tensor, _ want: Tensor) -> Double {
    var worst = 0.0
    for (g, w) in zip(got.data, want.data) where g != w {
        if g.isNaN || w.isNaN { return .nan }
        // an infinity against anything else is infinitely off (inf / inf would say NaN)
        let d = w.isInfinite ? .infinity : Double(abs(g - w)) / max(1, Double(abs(w)))
        worst = max(worst, d)
    }
    return worst
}

/// How a package's blocks and its pipeline compare with a bundle.
public struct BundleReport {
    public struct BlockError {
        public let key: String
        public var calls: Int
        public var maxAbsError: Double        // worst over its calls and outputs
        public var referenceMaxAbs: Double    // the recorded outputs' largest magnitude
    }

    public var blocks: [BlockError] = []      // per block, in the order first called
    public var frames: Pipeline.Result? = nil
    public var frameBytesDiffering = 0
    public var framesPSNR: Double = .infinity // of the frames against the bundle's
    /// A bundle recorded from a seed: the worst absolute difference between the latents the
    /// pipeline drew for it and the recorded ones (nil: the bundle gave its latents).
    public var seedLatentsDifference: Double? = nil
}

extension Pipeline {
    /// Each recorded call's inputs through this pipeline's blocks, its outputs against the
    /// recorded ones: per block, the worst error (the check a user runs on a device, where
    /// the blocks run through CoreML). Loads and unloads blocks through the loader.
    public func blockErrors(against bundle: ConformanceBundle) throws -> [BundleReport.BlockError] {
        try bundle.check(manifest)
        var errors: [BundleReport.BlockError] = []
        var index: [String: Int] = [:]
        for call in bundle.calls {
            let block = try loader.block(call.key)
            let outputs = try block.predict(call.inputs.mapValues(bundle.tensor))
            loader.done(call.key)
            var worst = 0.0, scale = 0.0
            for (name, ref) in call.outputs {
                let want = bundle.tensor(ref)
                guard let got = outputs[name], got.shape == want.shape else {
                    throw RuntimeError.block("block \(call.key): no " +
                                             "output \(name) of shape \(want.shape)")
                }
                for (g, w) in zip(got.data, want.data) {
                    worst = max(worst, Double(abs(g - w)).isNaN ? .infinity : Double(abs(g - w)))
                    scale = max(scale, Double(abs(w)))
                }
            }
            if let i = index[call.key] {
                errors[i].calls += 1
                errors[i].maxAbsError = max(errors[i].maxAbsError, worst)
                errors[i].referenceMaxAbs = max(errors[i].referenceMaxAbs, scale)
            } else {
                index[call.key] = errors.count
                errors.append(.init(key: call.key, calls: 1, maxAbsError: worst,
                                    referenceMaxAbs: scale))
            }
        }
        return errors
    }

    /// The bundle's generation (its prompt, negative prompt, initial noise and settings)
    /// through this pipeline, the frames compared with the bundle's. A bundle recorded from a
    /// seed runs from that seed, its noise drawn here (TorchNoise), which must be the recorded
    /// latents within `latentsTolerance` (checked before anything runs, and of the run's own
    /// draw after); one recorded from given latents runs from them.
    public func run(_ bundle: ConformanceBundle, latentsTolerance: Double = 1e-5,
                    onStep: ((Int, Int) -> Void)? = nil) throws -> BundleReport {
        try bundle.check(manifest)
        var settings = manifest.sampler
        try bundle.configure(&settings)
        let recorded = bundle.tensor(bundle.latents)
        func drift(_ drawn: Tensor, _ what: String) throws -> Double {
            let worst = zip(drawn.data, recorded.data).reduce(0.0) {
                max($0, Double(abs($1.0 - $1.1)))
            }
            guard drawn.shape == recorded.shape, worst <= latentsTolerance else {   // NaN too
                throw RuntimeError.block("\(bundle.jsonFile.path): " +
                                         "seed \(bundle.seed!): \(what) differ from the " +
                                         "recorded latents by \(worst) (> \(latentsTolerance)); " +
                                         "this runtime's noise for a seed is not the recording's")
            }
            return worst
        }
        if let seed = bundle.seed {
            try TorchNoise.checkNoise(manifest.noise, where: "manifest.json")
            _ = try drift(try TorchNoise.randn(shape: recorded.shape, seed: seed),
                          "the latents drawn for it")
        }
        let result = try generate(bundle.prompt, negativePrompt: bundle.negativePrompt,
                                  seed: bundle.seed,
                                  latents: bundle.seed == nil ? recorded : nil,
                                  configure: { $0 = settings }, onStep: onStep)
        var report = BundleReport()
        report.frames = result
        if bundle.seed != nil {
            report.seedLatentsDifference = try drift(result.noise, "the pipeline's latents")
        }
        let want = bundle.tensor(bundle.frames)
        let got = result.frames.flatMap { $0 }.map(Float.init)
        guard want.shape == [result.frames.count, result.height, result.width, 3] else {
            throw RuntimeError.block(
                "\(bundle.jsonFile.path): frames of shape \(want.shape); this " +
                "run made \([result.frames.count, result.height, result.width, 3])")
        }
        var squared = 0.0
        for (g, w) in zip(got, want.data) where g != w {
            report.frameBytesDiffering += 1
            squared += Double((g - w) * (g - w))
        }
        if report.frameBytesDiffering > 0 {
            report.framesPSNR = 10 * log10(255 * 255 / (squared / Double(got.count)))
        }
        return report
    }
}

extension Tensor {
    /// `shape` values of `dtype` ("float32", "int32" or "uint8"; bounds checked by the
    /// caller) at byte `offset` of little-endian `data`, as float32.
    public init(littleEndian data: Data, dtype: String, shape: [Int], offset: Int) {
        let count = shape.reduce(1, *)
        let values: [Float] = data.withUnsafeBytes { raw in
            let base = raw.baseAddress!.advanced(by: offset)
            switch dtype {
            case "int32":
                return (0..<count).map {
                    Float(Int32(littleEndian: base.loadUnaligned(fromByteOffset: 4 * $0,
                                                                 as: Int32.self)))
                }
            case "uint8":
                return (0..<count).map { Float(base.load(fromByteOffset: $0, as: UInt8.self)) }
            default:
                return (0..<count).map {
                    Float(bitPattern: UInt32(
                        littleEndian: base.loadUnaligned(fromByteOffset: 4 * $0, as: UInt32.self)))
                }
            }
        }
        self.init(shape: shape, data: values)
    }
}
