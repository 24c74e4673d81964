import EdgeCore
import Foundation

/// Runs a package from `edge export --target iphone`, as runtimes/python/pipeline.py runs an
/// ONNX one, making the same block calls in the same order: text encoder (one caption per
/// call) -> the sampler over the transformer's blocks (flow-match Euler or UniPC, with
/// guidance, LPL, TDTM variants and the step cache of EdgeCore's sampler) -> VAE decoder
/// (frame by frame, or piece by piece with its state carried where the component is
/// chunked). Whatever the family: the manifest says how prompts are cleaned and tokenized,
/// whether the unconditional caption is learned or a negative prompt, and how the decoder
/// takes the latents. Blocks run through a `BlockBackend` (CoreML, or Core AI for a Core AI
/// package, on Apple platforms); the loader decides what is loaded when. One prompt at a
/// time: the programs have the static shapes of one prompt (the transformer's batch is that
/// prompt and the unconditional one; an unguided call the prompt's half alone, through the
/// blocks' `unguided` functions where the package has them).
public final class Pipeline {
    /// What `generate` gives: the decoded frames, or the denoised latents alone (the Python
    /// runtime's output_type="latent"; nothing decoded, so they can be decoded elsewhere).
    public enum OutputType: Sendable { case frames, latent }

    public struct Result {
        public let frames: [[UInt8]]      // RGB, height x width x 3 per frame; none for .latent
        public let width: Int, height: Int     // 0 for .latent
        public let timings: [String: Double]   // seconds per stage, and the loader's loads
        public let trace: Trace
        public let noise: Tensor                // the initial latents: the seed's draw or those
                                                // given
        public let latents: Tensor              // the denoised latents (1, C, T, h, w), before
                                                // decoding
    }

    public let root: URL
    public let manifest: Manifest
    public let tokenizer: any CaptionTokenizer
    let cleaner: PromptCleaner
    public let loader: BlockLoader
    /// What loading found that the user should hear of without it stopping anything (files
    /// in the folder the manifest does not list).
    public let notices: [String]
    let nullCaption: Tensor?   // the learned unconditional caption (1, max_tokens, width)
    private let lock = NSLock()

    /// Verify the package (no path escapes, every listed file's size and sha256; an unlisted file
    /// is named in `notices`) before anything runs, then plan the loader for `budget` bytes of
    /// loaded blocks (nil: keep every block once loaded; refused if smaller than the largest
    /// block).
    public convenience init(package root: URL, backend: BlockBackend, budget: Int? = nil,
                            verify: Bool = true, coldReads: Bool = false) throws {
        try self.init(package: root, budget: budget, verify: verify, coldReads: coldReads,
                      makeBackend: { _ in backend })
    }

    /// As above, with a backend made from the decoded manifest (CoreML's compute units and
    /// output names are in it), so the manifest is read once.
    public init(package root: URL, budget: Int? = nil, verify: Bool = true, coldReads: Bool = false,
                makeBackend: (Manifest) throws -> BlockBackend) throws {
        self.root = root
        let manifestURL = root.appendingPathComponent("manifest.json")
        guard let data = FileManager.default.contents(atPath: manifestURL.path) else {
            throw RuntimeError.package("\(manifestURL.path): missing; not an edge package folder")
        }
        manifest = try ManifestReader.decode(data)
        let verified = try PackageFiles.verify(manifest, root: root, hashes: verify)
        let identities = verified.identities
        notices = verified.notices
        let tokURL = try PackageFiles.resolve(root, manifest.tokenizer.files[0].path, "tokenizer")
        do {
            tokenizer = try loadCaptionTokenizer(contentsOf: tokURL,
                                                 maxTokens: manifest.tokenizer.maxTokens,
                                                 padToken: manifest.tokenizer.padToken,
                                                 embeddingRows: manifest.tokenizer.embeddingRows)
            cleaner = try PromptCleaner(kind: manifest.tokenizer.clean)
        } catch let error as TokenizerLoadError {
            throw RuntimeError.package("\(manifest.tokenizer.files[0].path): \(error)")
        }
        if let record = manifest.conditioning.nullCaptionF32 {
            let nullURL = try PackageFiles.resolve(root, record.path,
                                                   "conditioning.null_caption_f32")
            let raw = try Data(contentsOf: nullURL)
            let n = manifest.tokenizer.maxTokens
            guard raw.count % (4 * n) == 0 else {
                throw RuntimeError.package("\(record.path): \(raw.count) " +
                                           "bytes is not \(n) rows of float32")
            }
            // little-endian float32, as every platform Swift runs edge on
            let values = raw.withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }
            let notFinite = values.lazy.filter { !$0.isFinite }.count
            if notFinite > 0 {   // else every video would come back NaN
                throw RuntimeError.package("\(record.path): \(notFinite) of " +
                                           "its \(values.count) values are not finite " +
                                           "(NaN or infinity); re-export the package")
            }
            nullCaption = Tensor(shape: [1, n, values.count / n], data: values)
        } else {
            nullCaption = nil
        }
        let entries = try Self.entries(manifest, root: root)
        let transformer = try manifest.component("transformer").blocks.map {
            "transformer/\($0.name)"
        }
        loader = try BlockLoader(entries: entries, backend: try makeBackend(manifest),
                                 budget: budget, everyStep: transformer, identities: identities,
                                 coldReads: coldReads)
    }

    /// One loader entry per block and per block variant, with its files.
    static func entries(_ manifest: Manifest, root: URL) throws -> [BlockEntry] {
        var entries: [BlockEntry] = []
        for comp in manifest.components {
            for block in comp.blocks {
                let key = "\(comp.name)/\(block.name)"
                entries.append(try entry(key, block, program: block.model, files: block.files,
                                         bytes: block.weightBytes, root: root))
                for (name, variant) in (block.variants ?? [:]).sorted(by: { $0.key < $1.key }) {
                    entries.append(try entry("\(key)#\(name)", block.running(name),
                                             program: variant.model, files: variant.files,
                                             bytes: variant.weightBytes, root: root))
                }
            }
        }
        return entries
    }

    static func entry(_ key: String, _ block: Manifest.Block, program: String,
                      files: [Manifest.FileRecord],
                      bytes: Int, root: URL) throws -> BlockEntry {
        let mine = files.filter { $0.path.hasPrefix(program + "/") }
        let digest = String(
            StreamingSHA256.hex(Data(mine.map(\.sha256).sorted().joined().utf8)).prefix(16))
        return BlockEntry(key: key, block: block,
                          program: try PackageFiles.resolve(root, program, "block \(key)"),
                          function: block.function,
                          files: try mine.map {
                              try PackageFiles.resolve(root, $0.path, "block \(key)")
                          },
                          paths: mine.map(\.path),
                          weightBytes: bytes, digest: digest)
    }

    /// The variant a block runs for a call's `variant` (BlockVariants.blockVariant: a TDTM
    /// call runs a prologue's own program, an unguided merged call its `unguided` one).
    static func chosen(_ component: String, _ block: Manifest.Block,
                       _ variant: String?) throws -> String? {
        do {
            return try BlockVariants.blockVariant(Set((block.variants ?? [:]).keys), variant)
        } catch {
            throw RuntimeError.block("block \(component)/\(block.name): \(error)")
        }
    }

    /// The loader's key of the program a block runs for a call's `variant`.
    static func key(_ component: String, _ block: Manifest.Block,
                    _ variant: String?) throws -> String {
        let base = "\(component)/\(block.name)"
        return try chosen(component, block, variant).map { "\(base)#\($0)" } ?? base
    }

    /// Run `blocks` of a component in order, passing outputs on by name; the next block is
    /// prefetched while one runs (`prefetchAfter`: what comes after the last one).
    func run(_ component: String, _ blocks: [Manifest.Block], _ feeds: [String: Tensor],
             variant: String? = nil, prefetchAfter: String? = nil) throws -> [String: Tensor] {
        var feeds = feeds
        for (i, base) in blocks.enumerated() {
            let k = try Self.key(component, base, variant)
            let block = base.running(try Self.chosen(component, base, variant))
            loader.prefetch(k)  // queued before the next one, where no earlier call queued it
            if i + 1 < blocks.count {
                loader.prefetch(try Self.key(component, blocks[i + 1], variant))
            }
            else if let next = prefetchAfter { loader.prefetch(next) }
            var inputs: [String: Tensor] = [:]
            for s in block.inputs {
                guard let value = feeds[s.name] else {
                    throw RuntimeError.block("block \(k): no value for its input \(s.name)")
                }
                guard value.shape == s.shape else {
                    throw RuntimeError.block("block \(k): input \(s.name) has " +
                                             "shape \(value.shape), the block takes \(s.shape)")
                }
                inputs[s.name] = value
            }
            let outputs = try loader.block(k).predict(inputs)
            for s in block.outputs {
                guard let value = outputs[s.name] else {
                    throw RuntimeError.block("block \(k): gave no output \(s.name)")
                }
                guard value.shape == s.shape else {
                    throw RuntimeError.block("block \(k): output \(s.name) has " +
                                             "shape \(value.shape), the manifest says \(s.shape)")
                }
                feeds[s.name] = value
            }
            loader.done(k)
        }
        return feeds
    }

    /// Hidden states (1, max_tokens, width) and mask of one caption, cleaned and tokenized
    /// as the package says; the text encoder's programs take one caption per call.
    func encode(_ caption: String,
                prefetchAfter: String?) throws -> (hidden: Tensor, mask: [Float]) {
        let (ids, mask) = tokenizer.encode(cleaner.clean(caption))
        let n = manifest.tokenizer.maxTokens
        let text = try manifest.component("text_encoder")
        let out = try run("text_encoder", text.blocks, [
            "input_ids": Tensor(shape: [1, n], data: ids.map(Float.init)),
            "attention_mask": Tensor(shape: [1, n], data: mask.map(Float.init))],
            prefetchAfter: prefetchAfter)
        guard let hidden = out["hidden"] else {
            throw RuntimeError.block("text_encoder: gave no hidden")
        }
        return (hidden, mask.map(Float.init))
    }

    /// One video of `prompt`. `seed` (0 to 2^63 - 1; default 0): the initial noise is
    /// `torch.randn` for it (EdgeCore TorchNoise, what diffusers and the Python runtime draw),
    /// refused for a package whose manifest defines seeds otherwise (no `noise` field: NumPy
    /// PCG64 noise). `latents`: the initial noise in diffusers' layout (1, C, T, h, w) instead
    /// of a seed's (refused together with a seed). `negativePrompt`: what the unconditional
    /// pass is told (default: the package's learned null caption, else its negative prompt).
    /// `configure` changes the package's sampler settings (steps, leap, merge_steps,
    /// cache_threshold, ...); `onStep(done, total)` reports progress; `isCancelled` is asked
    /// before every step, and a cancelled generation throws `RuntimeError.cancelled` and
    /// leaves the pipeline reusable. `decodeTimestep`, `decodeNoiseScale`, `decodeNoise`: for
    /// a package whose decoder is conditioned on a timestep (the manifest's `decode`, whose
    /// values they replace; `decodeConditioning`). `outputType` `.latent`: the denoised
    /// latents alone (`Result.latents`), the decoder not run.
    public func generate(_ prompt: String, negativePrompt: String? = nil, seed: UInt64? = nil,
                         latents: Tensor? = nil,
                         decodeTimestep: Double? = nil, decodeNoiseScale: Double? = nil,
                         decodeNoise: Tensor? = nil,
                         configure: (inout SamplerSettings) -> Void = { _ in },
                         onStep: ((Int, Int) -> Void)? = nil,
                         isCancelled: (() -> Bool)? = nil,
                         outputType: OutputType = .frames) throws -> Result {
        lock.lock(); defer { lock.unlock() }   // one generation at a time: the loader is its
        if seed != nil && latents != nil {
            throw NoiseError("seed and latents given together: the " +
                             "latents are the initial noise, so give one")
        }
        if latents == nil {
            try TorchNoise.checkSeed(seed ?? 0)
            try TorchNoise.checkNoise(manifest.noise, where: "manifest.json")
        }
        var settings = manifest.sampler
        configure(&settings)
        try settings.validate()
        let shape = [1] + manifest.latentShape
        if let latents, latents.shape != shape {
            throw RuntimeError.block("latents have shape \(latents.shape); this package " +
                                     "takes \(shape) (batch, channels, frames, height, width)")
        }
        let noise = try latents ?? TorchNoise.randn(shape: shape, seed: seed ?? 0)
        let conditioning = try decodeConditioning(seed: latents == nil ? seed ?? 0 : nil,
                                                  timestep: decodeTimestep,
                                                  noiseScale: decodeNoiseScale, noise: decodeNoise)
        let dit = try manifest.component("transformer"), vae = try manifest.component("vae_decoder")
        if settings.mergeSteps > 0 && !dit.blocks.contains(where: { $0.variants?["tdtm"] != nil }) {
            throw ManifestError.invalid("merge_steps=\(settings.mergeSteps): the package " +
                                        "has no tdtm transformer variants; export it again")
        }
        // an unguided call runs the caption's half alone where every block has its programs
        // (`unguided` variants), else the pair with the null half dropped
        let alone = BlockVariants.runsAlone(dit.blocks, mergeSteps: settings.mergeSteps)
        let before = loader.stats
        var clock = PhaseClock()
        let captions = try clock.phase("text_encoder") {
            try guidanceCaptions(prompt, negativePrompt: negativePrompt, alone: alone,
                                 settings: settings,
                                 firstStep: prologueKey(dit, 0, alone, settings))
        }
        var trace = Trace()
        let denoised = try clock.phase("transformer") {
            try denoise(noise, captions: captions, alone: alone, settings: settings,
                        onStep: onStep, isCancelled: isCancelled, trace: &trace)
        }
        let (video, width, height) = try clock.phase("vae_decoder") {
            outputType == .latent ? ([], 0, 0)
                : try decode(denoised, vae, conditioning: conditioning)
        }
        var timings = clock.finish()
        let after = loader.stats
        timings["block_loads"] = Double(after.loads - before.loads)
        timings["block_load_s"] = after.loadSeconds - before.loadSeconds
        timings["block_wait_s"] = after.waitSeconds - before.waitSeconds
        return Result(frames: video, width: width, height: height, timings: timings, trace: trace,
                      noise: noise,
                      latents: denoised)
    }

    /// The transformer prologue's program of call `call` (it never merges).
    func prologueKey(_ dit: Manifest.Component, _ call: Int, _ alone: Bool,
                     _ settings: SamplerSettings) throws -> String {
        try Self.key("transformer", dit.blocks[0], BlockVariants.callVariant(
            merged: false, alone: alone && !guidedCall(settings, call)))
    }

    /// The guidance batch's captions and masks: the prompt's, then the unconditional one;
    /// where no call is guided and the caption's half runs `alone`, the prompt's only.
    func guidanceCaptions(_ prompt: String, negativePrompt: String?, alone: Bool,
                          settings: SamplerSettings,
                          firstStep: String) throws -> (hidden: Tensor, mask: Tensor) {
        let n = manifest.tokenizer.maxTokens
        if alone && !guidedCall(settings, 0) {
            let (hidden, mask) = try encode(prompt, prefetchAfter: firstStep)
            return (hidden, Tensor(shape: [1, n], data: mask))
        }
        if let nullCaption, negativePrompt == nil {
            let (hidden, mask) = try encode(prompt, prefetchAfter: firstStep)
            // the manifest's null_caption_mask: as the prompt's (Open-Sora), else every token
            let nullMask = manifest.nullCaptionMask == "prompt"
                ? mask : [Float](repeating: 1, count: n)
            return (Tensor.concat([hidden, nullCaption]),
                    Tensor(shape: [2, n], data: mask + nullMask))
        }
        let text = try manifest.component("text_encoder")
        let (hidden, mask) = try encode(prompt,
                                        prefetchAfter: "text_encoder/\(text.blocks[0].name)")
        let (unconditional, unconditionalMask) = try encode(
            negativePrompt ?? manifest.negativePrompt ?? "", prefetchAfter: firstStep)
        return (Tensor.concat([hidden, unconditional]),
                Tensor(shape: [2, n], data: mask + unconditionalMask))
    }

    /// The sampler's loop over the transformer from `noise`, the calls taking `captions`;
    /// `isCancelled` is asked before every call.
    func denoise(_ noise: Tensor, captions: (hidden: Tensor, mask: Tensor), alone: Bool,
                 settings: SamplerSettings, onStep: ((Int, Int) -> Void)?,
                 isCancelled: (() -> Bool)?, trace: inout Trace) throws -> Tensor {
        let dit = try manifest.component("transformer"), vae = try manifest.component("vae_decoder")
        let prologue = dit.blocks[0], epilogue = dit.blocks[dit.blocks.count - 1]
        let pairs = Array(dit.blocks.dropFirst().dropLast())
        let predict: Predictor = { [self] x, t, step in
            if isCancelled?() == true { throw RuntimeError.cancelled }
            let single = alone && !step.guided   // the caption's half alone
            let variant = BlockVariants.callVariant(merged: step.merged, alone: single)
            let rows = single ? 1 : 2
            // while one part runs, the next one's first block loads (across steps too)
            let nextPair = try pairs.first.map { try Self.key("transformer", $0, variant) }
            var feeds = try run("transformer", [prologue], [
                "latent": single ? x : Tensor.concat([x, x]),
                "t": Tensor(shape: [rows], data: Array(repeating: t, count: rows)),
                "caption": captions.hidden.slice(axis: 0, 0..<rows),
                "caption_mask": captions.mask.slice(axis: 0, 0..<rows)],
                variant: variant, prefetchAfter: nextPair)
            guard let tokens = feeds["x"], let tMod = feeds["t_mod"] else {
                throw RuntimeError.block("transformer/\(prologue.name): gave no x or t_mod")
            }
            let (after, _) = try runPairs(step, x: tokens, tMod: tMod) { h in
                try run("transformer", pairs, feeds.merging(["x": h]) { $1 }, variant: variant,
                        prefetchAfter: try Self.key("transformer", epilogue, variant))["x"]!
            }
            feeds["x"] = after
            let next = step.last ? "vae_decoder/\(vae.blocks[0].name)"
                : try prologueKey(dit, step.index + 1, alone, settings)
            guard let v = try run("transformer", [epilogue], feeds, variant: variant,
                                  prefetchAfter: next)["velocity"] else {
                throw RuntimeError.block("transformer/\(epilogue.name): gave no velocity")
            }
            // a pair run on an unguided step (no caption-half programs) keeps the caption's half
            return (v.item(0), step.guided ? v.item(1) : nil)
        }
        let denoised = try sample(predict: predict, noise: noise, settings: settings,
                                  onStep: onStep, trace: &trace)
        if denoised.data.contains(where: { !$0.isFinite }) {
            throw RuntimeError.block("the denoised latents hold NaN or infinity " +
                                     "(sampler settings \(settings)); the " +
                                     "package's blocks or these settings are broken")
        }
        return denoised
    }

    /// A timestep-conditioned decoder's inputs, where the manifest has `decode` (else none,
    /// and giving any is refused): the timestep (given, else the manifest's); the noise
    /// scale (given, else the manifest's, else the timestep's value, as diffusers'
    /// decode_noise_scale=None); the noise, given (1, C, T, h, w), else for `seed` the second
    /// draw of its generator after the initial latents (what diffusers draws from the
    /// pipeline's generator; TorchNoise.randnDraws). Given latents (`seed` nil) need a given
    /// noise unless the scale is 0. As runtimes/python/generation_inputs.py decode_conditioning.
    func decodeConditioning(seed: UInt64?, timestep: Double?, noiseScale: Double?,
                            noise: Tensor?) throws -> [String: Tensor] {
        guard let spec = manifest.decode else {
            if timestep != nil || noiseScale != nil || noise != nil {
                throw RuntimeError.block("package \(root.path): its decoder takes no decode " +
                                         "timestep or noise (the manifest has no 'decode')")
            }
            return [:]
        }
        for (name, value) in [("decodeTimestep", timestep), ("decodeNoiseScale", noiseScale)] {
            if let value, !value.isFinite {
                throw RuntimeError.block("\(name) \(value) must be a finite number")
            }
        }
        let t = timestep ?? spec.timestep
        let scale = noiseScale ?? spec.noiseScale ?? t
        let shape = [1] + manifest.latentShape
        let mixed: Tensor
        if let noise {
            guard noise.shape == shape, noise.data.allSatisfy(\.isFinite) else {
                throw RuntimeError.block("decodeNoise must be finite values of " +
                                         "shape \(shape), got shape \(noise.shape)")
            }
            mixed = noise
        } else if scale == 0 {
            // weight 0
            mixed = Tensor(shape: shape, data: [Float](repeating: 0, count: shape.reduce(1, *)))
        } else if let seed {
            let count = shape.reduce(1, *)
            mixed = Tensor(shape: shape,
                           data: try TorchNoise.randnDraws(counts: [count, count], seed: seed)[1])
        } else {
            throw RuntimeError.block("decode noise scale \(scale) with given latents: " +
                                     "pass decodeNoise too (diffusers draws it from " +
                                     "the pipeline's generator), or decodeNoiseScale 0")
        }
        return ["decode_t": Tensor(shape: [1], data: [Float(t)]),
                "decode_noise_scale": Tensor(shape: [1], data: [Float(scale)]),
                "decode_noise": mixed]
    }

    /// Latents (1, C, T, h, w) -> RGB frames, as the package's decoder takes them: every
    /// frame as an image ("frames": (T, C, h, w) in, (T, 3, H, W) out) or the video as it is
    /// ("video": (1, 3, T', H, W) out), whole or piece by piece where it is chunked;
    /// `conditioning`: a timestep-conditioned decoder's inputs (`decodeConditioning`).
    func decode(_ latents: Tensor, _ vae: Manifest.Component,
                conditioning: [String: Tensor] = [:])
        throws -> (frames: [[UInt8]], width: Int, height: Int) {
        let video = manifest.latentLayout == "video"
        let z = video ? latents : Self.framesFirst(latents)
        let decoded: Tensor
        let (h, w) = (z.shape[z.shape.count - 2], z.shape[z.shape.count - 1])
        if video, let tiling = vae.tiles, tiling.applies(height: h, width: w) {
            decoded = try decodeTiles(vae, tiling, z)
        } else if let spec = vae.chunked {
            decoded = try runChunked(vae, spec, z)
        } else {
            guard let out = try run("vae_decoder", vae.blocks,
                                    conditioning.merging(["z": z]) { $1 })["frames"] else {
                throw RuntimeError.block("vae_decoder: gave no frames")
            }
            decoded = out
        }
        if video {  // (1, 3, T', H, W)
            let s = decoded.shape
            return (Self.rgbFrames(decoded.reshaped([3, s[2], s[3], s[4]]), channelsFirst: true),
                    s[4], s[3])
        }
        return (Self.rgbFrames(decoded), decoded.shape[3], decoded.shape[2])
    }

    /// Latents (1, C, T, h, w) decoded a tile at a time, each tile through its size's
    /// programs (`tile_RxC` variants) and blended as it comes (Tiles.swift, as
    /// runtimes/python/pipeline.py _decode_tiles) -> (1, 3, T', H, W), unclamped (the frames
    /// are clamped as they are made bytes).
    func decodeTiles(_ vae: Manifest.Component, _ tiling: Tiling, _ z: Tensor) throws -> Tensor {
        let (h, w) = (z.shape[3], z.shape[4])
        let base = Array(vae.blocks[0].inputs.first { $0.shape.count == 5 }!.shape.suffix(2))
        let (rows, cols) = tiling.starts(height: h, width: w)
        var blended: BlendedTiles? = nil
        var frames = 0
        for (i, top) in rows.enumerated() {
            for (j, left) in cols.enumerated() {
                let size = tiling.size(row: top, col: left, height: h, width: w)
                let tile = z.slice(axis: 3, top..<(top + size[0]))
                    .slice(axis: 4, left..<(left + size[1]))
                let out: Tensor
                if let spec = vae.chunked {
                    out = try runChunked(vae, spec, tile) {
                        Tiling.tileVariant($0, size: size, base: base)
                    }
                } else {
                    guard let got = try run("vae_decoder", vae.blocks, ["z": tile],
                                            variant: Tiling.tileVariant(nil, size: size,
                                                                        base: base))["frames"]
                    else { throw RuntimeError.block("vae_decoder: gave no frames") }
                    out = got
                }
                let s = out.shape  // (1, 3, T', th, tw)
                if blended == nil {
                    blended = BlendedTiles(tiling, latentHeight: h, latentWidth: w,
                                           lead: s[1] * s[2])
                }
                blended!.add(i, j, out.data, h: s[3], w: s[4])
                frames = s[2]
            }
        }
        return Tensor(shape: [1, 3, frames, blended!.height, blended!.width],
                      data: blended!.output)
    }

    /// A chunked component: its blocks once per piece of the input, the first piece through
    /// the first variant, the state handed from each piece to the next, the output's pieces
    /// joined (runtimes/python/pipeline.py _run_chunked).
    /// `asTile`: the variant each call runs for the one it would run untiled (a tile's).
    func runChunked(_ comp: Manifest.Component, _ spec: Manifest.Chunked, _ whole: Tensor,
                    asTile: (String?) -> String? = { $0 }) throws -> Tensor {
        guard spec.axis < whole.shape.count,
              let bounds = spec.pieceBounds(whole.shape[spec.axis]) else {
            throw RuntimeError.block("component \(comp.name): \(spec.input) of " +
                                     "shape \(whole.shape) does not split into a first " +
                                     "piece of \(spec.firstSize ?? spec.size) and " +
                                     "pieces of \(spec.size) along axis \(spec.axis)")
        }
        var pieces: [Tensor] = [], state: [String: Tensor] = [:]
        for (i, range) in bounds.enumerated() {
            let piece = whole.slice(axis: spec.axis, range)
            let next = i + 1 < bounds.count ? "\(comp.name)/\(comp.blocks[0].name)" : nil
            let out = try run(comp.name, comp.blocks, state.merging([spec.input: piece]) { $1 },
                              variant: asTile(i == 0 ? spec.firstVariant : nil),
                              prefetchAfter: next)
            guard let part = out[spec.output] else {
                throw RuntimeError.block("\(comp.name): gave no \(spec.output)")
            }
            pieces.append(part)
            state = [:]
            for name in spec.state {
                guard let value = out[name] else {
                    throw RuntimeError.block("\(comp.name): gave no state \(name)")
                }
                state[name] = value
            }
        }
        return Tensor.concat(pieces, axis: spec.outputAxis ?? spec.axis)
    }

    /// (1, C, T, h, w) -> (T, C, h, w): every frame through the decoder at once.
    static func framesFirst(_ latents: Tensor) -> Tensor {
        let (c, frames, h, w) = (latents.shape[1], latents.shape[2], latents.shape[3],
                                 latents.shape[4])
        var z = [Float](repeating: 0, count: latents.count)
        for ci in 0..<c { for ti in 0..<frames { for p in 0..<(h * w) {
            z[(ti * c + ci) * h * w + p] = latents.data[(ci * frames + ti) * h * w + p]
        } } }
        return Tensor(shape: [frames, c, h, w], data: z)
    }

    /// (T, 3, H, W) — or (3, T, H, W) with `channelsFirst` — in [0, 1] -> per frame H x W x RGB
    /// bytes, rounded half to even as NumPy's np.round (the Python runtime's frames).
    static func rgbFrames(_ decoded: Tensor, channelsFirst: Bool = false) -> [[UInt8]] {
        let (frames, height, width) = channelsFirst ? (decoded.shape[1], decoded.shape[2],
                                                       decoded.shape[3])
            : (decoded.shape[0], decoded.shape[2], decoded.shape[3])
        let plane = height * width
        return (0..<frames).map { ti in
            var rgb = [UInt8](repeating: 0, count: plane * 3)
            for ch in 0..<3 {
                let base = (channelsFirst ? ch * frames + ti : ti * 3 + ch) * plane
                for p in 0..<plane {
                    let value = decoded.data[base + p]
                    rgb[p * 3 + ch] = UInt8(max(0,
                                                min(255, (value * 255).rounded(.toNearestOrEven))))
                }
            }
            return rgb
        }
    }

    /// Unload every block (e.g. on a memory warning).
    public func unload() { loader.unloadAll() }
}
