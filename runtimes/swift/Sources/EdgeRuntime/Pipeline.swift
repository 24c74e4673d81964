#if canImport(CoreML)
import CoreML
import CryptoKit
import EdgeCore
import Foundation

/// Runs a package from `edge export --target iphone`, as runtimes/python/pipeline.py runs an
/// ONNX one: text encoder -> rectified-flow sampler over the transformer's blocks (with
/// guidance, LPL, TDTM variants and the step cache of EdgeCore's sampler) -> VAE decoder.
/// One prompt at a time: the programs have the static shapes of one prompt (the
/// transformer's batch is that prompt plus the null caption).
public final class EdgePipeline {
    public struct Result {
        public let frames: [[UInt8]]      // RGB, height x width x 3 per frame
        public let width: Int, height: Int
        public let timings: [String: Double]   // seconds per stage, and the loader's loads
        public let trace: Trace
    }

    public let root: URL
    public let manifest: Manifest
    public let tokenizer: WordPieceTokenizer
    let nullCaption: Tensor
    let loader: BlockLoader
    let prefix: String

    /// Verify the package (every listed file's size and sha256) before anything runs, then
    /// prepare the loader. `budget`: bytes of blocks to keep loaded at most (nil: as memory
    /// allows).
    public init(package root: URL, budget: Int? = nil, verify: Bool = true,
                computeUnits: MLComputeUnits? = nil) throws {
        self.root = root
        manifest = try ManifestReader.decode(Data(contentsOf: root.appendingPathComponent("manifest.json")))
        if verify { try Self.verifyFiles(manifest, root: root) }
        tokenizer = try WordPieceTokenizer(contentsOf: root.appendingPathComponent(manifest.tokenizer.files[0].path),
                                           maxTokens: manifest.tokenizer.maxTokens)
        let raw = try Data(contentsOf: root.appendingPathComponent(manifest.conditioning.nullCaptionF32.path))
        let values = raw.withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }  // little-endian, as iOS
        nullCaption = Tensor(shape: [1, manifest.tokenizer.maxTokens, values.count / manifest.tokenizer.maxTokens], data: values)
        prefix = manifest.coreml.outputPrefix
        var entries: [BlockLoader.Entry] = []
        for comp in manifest.components {
            for block in comp.blocks {
                let key = "\(comp.name)/\(block.name)"
                entries.append(.init(key: key, package: root.appendingPathComponent(block.model),
                                     weightBytes: block.weightBytes, digest: Self.digest(block.files, under: block.model)))
                for (name, variant) in block.variants ?? [:] {
                    entries.append(.init(key: "\(key)#\(name)", package: root.appendingPathComponent(variant.model),
                                         weightBytes: variant.weightBytes, digest: Self.digest(variant.files, under: variant.model)))
                }
            }
        }
        let caches = FileManager.default.urls(for: .cachesDirectory, in: .userDomainMask)[0]
            .appendingPathComponent("edge-compiled")
        loader = BlockLoader(entries: entries, computeUnits: computeUnits ?? Self.units(manifest.coreml.computeUnits),
                             cacheFolder: caches, budget: budget)
    }

    static func units(_ name: String) -> MLComputeUnits {
        switch name {
        case "cpuOnly": return .cpuOnly
        case "cpuAndGPU": return .cpuAndGPU
        case "all": return .all
        default: return .cpuAndNeuralEngine
        }
    }

    static func digest(_ files: [Manifest.FileRecord], under folder: String) -> String {
        let joined = files.filter { $0.path.hasPrefix(folder + "/") }.map(\.sha256).sorted().joined()
        return SHA256.hash(data: Data(joined.utf8)).map { String(format: "%02x", $0) }.joined().prefix(16).description
    }

    /// Every listed file exists with the listed size and sha256.
    static func verifyFiles(_ manifest: Manifest, root: URL) throws {
        for file in manifest.allFiles {
            let url = root.appendingPathComponent(file.path)
            guard let handle = try? FileHandle(forReadingFrom: url) else {
                throw ManifestError.invalid("\(file.path): missing (listed in manifest.json)")
            }
            defer { try? handle.close() }
            var hasher = SHA256(), size = 0
            while let chunk = try handle.read(upToCount: 8 << 20), !chunk.isEmpty {
                hasher.update(data: chunk)
                size += chunk.count
            }
            if size != file.bytes {
                throw ManifestError.invalid("\(file.path): \(size) bytes, manifest says \(file.bytes) (truncated or altered)")
            }
            let hex = hasher.finalize().map { String(format: "%02x", $0) }.joined()
            if hex != file.sha256 { throw ManifestError.invalid("\(file.path): sha256 differs from the manifest (altered or corrupt)") }
        }
    }

    /// The loader's key of a block, or of its variant where it has one.
    static func key(_ component: String, _ block: Manifest.Block, _ variant: String?) -> String {
        let base = "\(component)/\(block.name)"
        if let variant, block.variants?[variant] != nil { return "\(base)#\(variant)" }
        return base
    }

    /// Run `blocks` of a component in order, passing outputs on by name; the next block is
    /// prefetched while one runs. `variant`: that variant's program where a block has one.
    func run(_ component: String, _ blocks: [Manifest.Block], _ feeds: [String: Tensor],
             variant: String? = nil, prefetchAfter: String? = nil) throws -> [String: Tensor] {
        var feeds = feeds
        func key(_ block: Manifest.Block) -> String { Self.key(component, block, variant) }
        for (i, block) in blocks.enumerated() {
            let k = key(block)
            if i + 1 < blocks.count { loader.prefetch(key(blocks[i + 1])) }
            else if let next = prefetchAfter { loader.prefetch(next) }
            let model = try loader.model(k)
            var inputs: [String: MLFeatureValue] = [:]
            for s in block.inputs {
                guard let t = feeds[s.name] else { throw ManifestError.invalid("block \(k): no input \(s.name)") }
                inputs[s.name] = MLFeatureValue(multiArray: try MultiArray.make(t, signature: s))
            }
            let out = try model.prediction(from: try MLDictionaryFeatureProvider(dictionary: inputs))
            for s in block.outputs {
                guard let array = out.featureValue(for: prefix + s.name)?.multiArrayValue else {
                    throw ManifestError.invalid("block \(k): no output \(prefix + s.name)")
                }
                feeds[s.name] = try MultiArray.tensor(array)
            }
            loader.done(k)
        }
        return feeds
    }

    /// One video of `prompt`. `configure` changes the package's sampler settings (steps,
    /// leap, merge_steps, cache_threshold, ...); `onStep(done, total)` reports progress.
    public func generate(_ prompt: String, seed: UInt64 = 0,
                         configure: (inout SamplerSettings) -> Void = { _ in },
                         onStep: ((Int, Int) -> Void)? = nil) throws -> Result {
        var settings = manifest.sampler
        configure(&settings)
        try settings.validate()
        let text = try manifest.component("text_encoder"), dit = try manifest.component("transformer")
        let vae = try manifest.component("vae_decoder")
        if settings.mergeSteps > 0 && !dit.blocks.contains(where: { $0.variants?["tdtm"] != nil }) {
            throw ManifestError.invalid("merge_steps=\(settings.mergeSteps): the package has no tdtm transformer variants; export it again")
        }
        var timings: [String: Double] = [:]
        let started = Date()

        let (ids, mask) = tokenizer.encode(prompt)
        let n = manifest.tokenizer.maxTokens
        let encoded = try run("text_encoder", text.blocks, [
            "input_ids": Tensor(shape: [1, n], data: ids.map(Float.init)),
            "attention_mask": Tensor(shape: [1, n], data: mask.map(Float.init))],
            prefetchAfter: "transformer/\(dit.blocks[0].name)")
        let caption2 = Tensor.concat([encoded["hidden"]!, nullCaption])
        let mask2 = Tensor(shape: [2, n], data: mask.map(Float.init) + [Float](repeating: 1, count: n))
        let t1 = Date()
        timings["text_encoder"] = t1.timeIntervalSince(started)

        let prologue = dit.blocks[0], epilogue = dit.blocks[dit.blocks.count - 1]
        let pairs = Array(dit.blocks.dropFirst().dropLast())
        let predict: Predictor = { [self] x, t, step in
            let variant = step.merged ? "tdtm" : nil
            // while one part runs, the next one's first block loads (across steps too)
            let nextPair = pairs.first.map { Self.key("transformer", $0, variant) }
            var feeds = try run("transformer", [prologue], [
                "latent": Tensor.concat([x, x]), "t": Tensor(shape: [2], data: [t, t]),
                "caption": caption2, "caption_mask": mask2], variant: variant, prefetchAfter: nextPair)
            let (after, _) = try runPairs(step, x: feeds["x"]!, tMod: feeds["t_mod"]!) { h in
                try run("transformer", pairs, feeds.merging(["x": h]) { $1 }, variant: variant,
                        prefetchAfter: "transformer/\(epilogue.name)")["x"]!
            }
            feeds["x"] = after
            let v = try run("transformer", [epilogue], feeds, variant: variant,
                            prefetchAfter: step.last ? "vae_decoder/\(vae.blocks[0].name)" : "transformer/\(prologue.name)")["velocity"]!
            return (v.item(0), v.item(1))
        }
        var noise = NormalNoise(seed: seed)
        let shape = manifest.latentShape
        var trace = Trace()
        let latents = try sample(predict: predict, noise: noise.sample([1] + shape), settings: settings,
                                 onStep: onStep, trace: &trace)
        let t2 = Date()
        timings["transformer"] = t2.timeIntervalSince(t1)

        // (1, C, T, H, W) -> (T, C, H, W): every frame through the decoder at once
        let (c, frames, h, w) = (shape[0], shape[1], shape[2], shape[3])
        var z = [Float](repeating: 0, count: latents.count)
        for ci in 0..<c { for ti in 0..<frames { for p in 0..<(h * w) {
            z[(ti * c + ci) * h * w + p] = latents.data[(ci * frames + ti) * h * w + p]
        } } }
        let decoded = try run("vae_decoder", vae.blocks, ["z": Tensor(shape: [frames, c, h, w], data: z)])["frames"]!
        let (height, width) = (decoded.shape[2], decoded.shape[3])
        var video: [[UInt8]] = []
        for ti in 0..<frames {  // (3, H, W) in [0, 1] -> H x W x RGB bytes
            var rgb = [UInt8](repeating: 0, count: height * width * 3)
            for ch in 0..<3 { for p in 0..<(height * width) {
                let value = decoded.data[(ti * 3 + ch) * height * width + p]
                rgb[p * 3 + ch] = UInt8(max(0, min(255, (value * 255).rounded())))
            } }
            video.append(rgb)
        }
        let t3 = Date()
        timings["vae_decoder"] = t3.timeIntervalSince(t2)
        timings["total"] = t3.timeIntervalSince(started)
        timings["block_loads"] = Double(loader.loads)
        timings["block_load_s"] = loader.loadSeconds
        return Result(frames: video, width: width, height: height, timings: timings, trace: trace)
    }

    /// Unload every block (e.g. on a memory warning).
    public func unload() { loader.unloadAll() }
}
#endif
