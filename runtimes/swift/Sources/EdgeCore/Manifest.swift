import Foundation

/// The edge package manifest (docs/package-format.md), as far as the Swift runtime reads it.
/// Fields it does not use (validation figures, tensor tables) are ignored.
public struct Manifest: Decodable {
    public struct FileRecord: Decodable, Equatable {
        public let path: String
        public let bytes: Int
        public let sha256: String
    }

    public struct Signature: Decodable, Equatable {
        public let name: String
        public let dtype: String      // "float32" or "int32" in iphone packages
        public let shape: [Int]       // static: iphone packages have no "batch" axis
    }

    public struct WeightsRef: Decodable, Equatable {
        public let path: String
    }

    public struct Variant: Decodable, Equatable {
        public let model: String      // the variant's .mlpackage folder (its block's, when a
                                      // function of it)
        public let function: String?  // its function in a multifunction program (iOS 18)
        public let files: [FileRecord]
        public let weightBytes: Int
        // its own signature where it differs from the block's (a chunked component's first
        // piece takes no carried state)
        public let inputs: [Signature]?
        public let outputs: [Signature]?
    }

    public struct Block: Decodable, Equatable {
        public let name: String
        public let model: String      // the block's .mlpackage folder
        public let function: String?  // "main" in a multifunction program (iOS 18); nil: a
                                      // program of its own
        public let files: [FileRecord]
        public let weights: WeightsRef
        public let weightBytes: Int
        public let inputs: [Signature]
        public let outputs: [Signature]
        public let variants: [String: Variant]?

        /// The block as its variant `variant` runs: that variant's signature where it has
        /// its own (edge/core/manifest_schema.py as_variant); the block itself for nil.
        public func running(_ variant: String?) -> Block {
            guard let variant, let v = variants?[variant] else { return self }
            return Block(name: name, model: v.model, function: v.function, files: v.files,
                         weights: weights, weightBytes: v.weightBytes,
                         inputs: v.inputs ?? inputs, outputs: v.outputs ?? outputs, variants: nil)
        }
    }

    /// A component run piece by piece (Wan's causal VAE decoder, one latent frame at a
    /// time): `input` split along `axis` into pieces of `size` after a first of `firstSize`
    /// (absent: `size`), the first piece through `firstVariant`, each `state` output fed to
    /// the same-named input of the next piece, the pieces of `output` joined along
    /// `outputAxis` (absent: `axis`) (edge/graph/blocks.py Chunking). No `firstVariant`: every
    /// piece through the blocks themselves (Open-Sora's 17-frame chunks, decoded alone).
    public struct Chunked: Decodable, Equatable {
        public let input: String
        public let output: String
        public let axis: Int
        public let size: Int
        public let firstVariant: String?
        public let state: [String]
        public let firstSize: Int?
        public let outputAxis: Int?

        /// [start, stop) of each piece of an axis of `length` (edge/core/pieces.py piece_bounds);
        /// nil where the pieces do not tile it.
        public func pieceBounds(_ length: Int) -> [Range<Int>]? {
            let first = firstSize ?? size
            guard length >= first, (length - first) % size == 0 else { return nil }
            return [0..<first] + stride(from: first, to: length, by: size).map { $0..<($0 + size) }
        }
    }

    public struct Component: Decodable, Equatable {
        public let name: String
        public let blocks: [Block]
        public let chunked: Chunked?
        public let tiles: Tiling?      // decoded in spatial tiles (Tiles.swift)
    }

    public struct TokenizerSpec: Decodable, Equatable {
        public let files: [FileRecord]
        public let maxTokens: Int
        public let padToken: String?   // absent: "[PAD]"
        public let clean: String?      // how prompts are cleaned first: "none" (absent) or "wan"
        /// Rows of the text encoder's embedding table; every token id must index one (absent
        /// in packages written before the field).
        public let embeddingRows: Int?
    }

    /// The unconditional pass's caption when it is learned (tiny-sora); absent, the package's
    /// `negative_prompt` (or the caller's) is encoded like the prompt (Wan).
    public struct Conditioning: Decodable, Equatable {
        public let nullCaption: FileRecord?
        public let nullCaptionF32: FileRecord?   // raw little-endian float32 (max_tokens, width)
    }

    public struct CoreML: Decodable, Equatable {
        public let minimumDeploymentTarget: String
        public let layout: String?    // "multifunction" (a block's variants are functions of
                                      // its program) or "separate"
        public let computeUnits: String
        public let computePrecision: String
        public let outputPrefix: String
    }

    /// A decoder conditioned on a timestep (LTX-Video 0.9.1+): the defaults of the decode
    /// timestep and of the scale of the noise mixed into the latents, (1 - s) z + s noise
    /// (nil: the timestep's value, as diffusers' decode_noise_scale=None). Absent for a
    /// decoder taking the latents alone.
    public struct Decode: Decodable, Equatable {
        public let timestep: Double
        public let noiseScale: Double?
    }

    /// What a timestep-conditioned decoder takes beside `z` (runtimes/python DECODE_INPUTS).
    public static let decodeInputs: Set<String> = ["decode_t", "decode_noise_scale", "decode_noise"]

    public let format: String
    public let formatVersion: Int
    public let producer: String
    public let target: String
    public let model: String
    public let tokenizer: TokenizerSpec
    public let conditioning: Conditioning
    public let negativePrompt: String?
    /// How the null caption is masked: "all" (absent: every token) or "prompt" (as the
    /// prompt of its guidance pair: Open-Sora).
    public let nullCaptionMask: String?
    public let manifestSha256: String
    public let sampler: SamplerSettings
    public let latentShape: [Int]
    public let latentLayout: String?   // "frames" (absent: frames) or "video"
    /// What a seed means (TorchNoise.definition, "torch.randn/cpu/float32"); absent in a
    /// package written before the field, whose seeds meant NumPy PCG64 noise ("numpy.pcg64").
    /// Checked when a seed is drawn, not here: given latents run on any package.
    public let noise: String?
    public let coreml: CoreML
    public let components: [Component]
    public let decode: Decode?

    public func component(_ name: String) throws -> Component {
        guard let c = components.first(where: { $0.name == name }) else {
            throw ManifestError.invalid("manifest.json: no component \(name)")
        }
        return c
    }

    /// Every file the package lists, for verification before anything runs.
    public var allFiles: [FileRecord] {
        tokenizer.files + [conditioning.nullCaption, conditioning.nullCaptionF32].compactMap { $0 }
            + components.flatMap { $0.blocks.flatMap(\.files) }
    }
}

public enum ManifestError: Error, CustomStringConvertible, Equatable {
    case invalid(String)
    public var description: String {
        switch self { case .invalid(let why): return why }
    }
}

private struct Header: Decodable {
    let format: String
    let formatVersion: Int
    let target: String
}

public enum ManifestReader {
    public static let format = "edge-package"
    public static let formatVersion = 1

    /// Decode and check a manifest: the format, its version and the target first (so a
    /// package of another version or target gets a plain error), then every field.
    /// The decoder for edge JSON: snake_case keys become the Swift names.
    public static func jsonDecoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return decoder
    }

    public static func decode(_ data: Data) throws -> Manifest {
        let decoder = jsonDecoder()
        let header: Header
        do { header = try decoder.decode(Header.self, from: data) } catch {
            throw ManifestError.invalid("manifest.json: not an edge manifest (\(error))")
        }
        guard header.format == format else {
            throw ManifestError.invalid("manifest.json: format \(header.format), " +
                                        "expected \(format)")
        }
        guard header.formatVersion == formatVersion else {
            throw ManifestError.invalid("manifest.json: unknown " +
                                        "format_version \(header.formatVersion); " +
                                        "this runtime reads version \(formatVersion)")
        }
        guard header.target == "iphone" else {
            throw ManifestError.invalid("manifest.json: target \(header.target); " +
                                        "the Swift runtime runs iphone packages " +
                                        "(edge export --target iphone)")
        }
        let manifest: Manifest
        do {
            manifest = try decoder.decode(Manifest.self, from: data)
        } catch let error as DecodingError {
            throw ManifestError.invalid("manifest.json: \(describe(error))")
        } catch {
            throw ManifestError.invalid("manifest.json: \(error)")
        }
        for comp in ["text_encoder", "transformer", "vae_decoder"] {
            _ = try manifest.component(comp)
        }
        try checkRunnable(manifest)
        for file in manifest.allFiles
        where file.path.hasPrefix("/") || file.path.split(separator: "/").contains("..") {
            throw ManifestError.invalid(
                "manifest.json: file path \(file.path) escapes the package folder")
        }
        return manifest
    }

    /// What the Python runtime's check_runnable refuses besides the target: no way to make
    /// the unconditional caption, an unknown latent layout or prompt cleaner, a chunked
    /// component that is not the decoder's pieces of `z` giving `frames`, a variant named
    /// by the chunking that a block lacks.
    static func checkRunnable(_ m: Manifest) throws {
        let learned = m.conditioning.nullCaption != nil && m.conditioning.nullCaptionF32 != nil
        if !learned && m.negativePrompt == nil {
            throw ManifestError.invalid("manifest.json: the unconditional pass needs " +
                                        "'conditioning.null_caption' (and " +
                                        "null_caption_f32) or a 'negative_prompt' string")
        }
        if let mode = m.nullCaptionMask, !["all", "prompt"].contains(mode) {
            throw ManifestError.invalid("manifest.json: field 'null_caption_mask' " +
                                        "is '\(mode)'; known: all, prompt")
        }
        if let layout = m.latentLayout, !["frames", "video"].contains(layout) {
            throw ManifestError.invalid("manifest.json: latent_layout \(layout); " +
                                        "known: frames, video")
        }
        if let clean = m.tokenizer.clean, !["none", "wan"].contains(clean) {
            throw ManifestError.invalid("manifest.json tokenizer: clean \(clean); known: none, wan")
        }
        if let rows = m.tokenizer.embeddingRows, rows < 1 {
            throw ManifestError.invalid("manifest.json tokenizer: " +
                                        "embedding_rows \(rows); must be at least 1")
        }
        // the latents are allocated from this shape: positive sides, at most 2^31 floats
        guard m.latentShape.count >= 3, m.latentShape.allSatisfy({ $0 >= 1 }),
              checkedCount(m.latentShape, width: 4, limit: 1 << 33) != nil else {
            throw ManifestError.invalid("manifest.json: latent_shape \(m.latentShape) is no " +
                                        "latent shape (positive sides, at most 2^31 values)")
        }
        try checkLayout(m)
        try checkDecode(m)
        try checkTiles(m)
        for comp in m.components {
            guard let spec = comp.chunked else { continue }
            if comp.name != "vae_decoder" || spec.input != "z" || spec.output != "frames" {
                throw ManifestError.invalid("manifest.json component \(comp.name) chunked: " +
                                            "pieces of \(spec.input) " +
                                            "giving \(spec.output); the Swift runtime runs " +
                                            "the vae_decoder's pieces of z giving frames")
            }
            if spec.size < 1 || spec.axis < 0 || (spec.firstSize ?? 1) < 1
                || (spec.outputAxis ?? 0) < 0 {
                throw ManifestError.invalid("manifest.json component \(comp.name) " +
                                            "chunked: axis \(spec.axis), size \(spec.size)")
            }
            guard let first = spec.firstVariant else {
                if let carried = spec.state.first {
                    throw ManifestError.invalid("manifest.json component \(comp.name) " +
                                                "chunked: state \(carried) is carried from " +
                                                "piece to piece but there is no first_variant " +
                                                "to run the first piece without it")
                }
                continue
            }
            for block in comp.blocks where block.variants?[first] == nil {
                throw ManifestError.invalid("manifest.json component \(comp.name) " +
                                            "block \(block.name): no " +
                                            "variant \(first) for the first piece")
            }
        }
    }

    /// A component in tiles (edge/core/manifest_schema.py _check_tiles): the decoder of
    /// one video's latents without decode conditioning, a valid tiling, its first block
    /// traced at the first tile of the latents, and every block with the variants of every
    /// other tile size (and their first pieces').
    static func checkTiles(_ m: Manifest) throws {
        for comp in m.components {
            guard let tiling = comp.tiles else { continue }
            let at = "manifest.json component \(comp.name) tiles"
            if comp.name != "vae_decoder" || m.latentLayout != "video" || m.decode != nil {
                throw ManifestError.invalid("\(at): the Swift runtime tiles only a decoder " +
                                            "of latents laid out as 'video' without decode " +
                                            "conditioning")
            }
            if let problem = tiling.problem { throw ManifestError.invalid("\(at): \(problem)") }
            let (h, w) = (m.latentShape[m.latentShape.count - 2], m.latentShape.last!)
            let sizes = tiling.tileSizes(height: h, width: w)
            let head = comp.blocks[0]
            let traced = head.inputs.first { $0.shape.count == 5 }.map { Array($0.shape.suffix(2)) }
            guard traced == sizes[0] else {
                let took = traced.map { $0.map(String.init).joined(separator: "x") } ?? "no video"
                throw ManifestError.invalid("\(at): block \(head.name) takes latents of " +
                                            "\(took), not the first tile's " +
                                            "\(sizes[0][0])x\(sizes[0][1])")
            }
            let pieces = Set([nil, comp.chunked?.firstVariant])
            for block in comp.blocks {
                for size in sizes.dropFirst() {
                    for variant in pieces {
                        let name = Tiling.tileVariant(variant, size: size, base: sizes[0])!
                        if block.variants?[name] == nil {
                            throw ManifestError.invalid("\(at): block \(block.name) has no " +
                                                        "variant \(name) for the tiles of " +
                                                        "\(size[0])x\(size[1]) latents")
                        }
                    }
                }
            }
        }
    }

    /// A decoder that takes the decode inputs needs the manifest's `decode` settings and
    /// runs on whole videos (the noise is one video's latents); a package with them has such
    /// a decoder (the Python runtime's check_decode).
    static func checkDecode(_ m: Manifest) throws {
        guard let decoder = m.components.first(where: { $0.name == "vae_decoder" }) else { return }
        let takes = Set(decoder.blocks.flatMap { $0.inputs.map(\.name) })
            .intersection(Manifest.decodeInputs)
        let list = Manifest.decodeInputs.sorted().joined(separator: ", ")
        if m.decode == nil {
            if takes.isEmpty { return }
            throw ManifestError.invalid("manifest.json: the vae_decoder " +
                                        "takes \(takes.sorted().joined(separator: ", ")) " +
                                        "but the manifest has no 'decode' settings")
        }
        if takes != Manifest.decodeInputs || decoder.chunked != nil || m.latentLayout != "video" {
            throw ManifestError.invalid("manifest.json decode: needs a whole-video vae_decoder " +
                                        "(latent_layout 'video', not chunked) taking \(list)")
        }
    }

    /// How the programs hold a block's variants (edge/core/manifest_schema.py): "separate" (absent;
    /// each variant a program of its own, iOS 17), "multifunction" (the block's program
    /// holds them as functions, iOS 18) or "coreai" (a Core AI model per block, its variants
    /// functions of it, iOS 27), with the same refusals as the Python side.
    public static let layouts = ["separate": 17, "multifunction": 18, "coreai": 27]
    static let layoutsWithFunctions: Set = ["multifunction", "coreai"]
    static let programSuffix = ["separate": ".mlpackage", "multifunction": ".mlpackage",
                                "coreai": ".aimodel"]

    static func checkLayout(_ m: Manifest) throws {
        let target = m.coreml.minimumDeploymentTarget
        guard target.hasPrefix("iOS"), let ios = Int(target.dropFirst(3)) else {
            throw ManifestError.invalid("manifest.json coreml: " +
                                        "minimum_deployment_target \(target) is not iOS<n>")
        }
        let layout = m.coreml.layout ?? "separate"
        guard let least = Self.layouts[layout] else {
            throw ManifestError.invalid("manifest.json coreml: layout \(layout); " +
                                        "known: separate, multifunction, coreai")
        }
        if ios < least {
            throw ManifestError.invalid("manifest.json coreml: layout \(layout) " +
                                        "needs iOS\(least) or later, but " +
                                        "minimum_deployment_target is \(target)")
        }
        func isName(_ s: String) -> Bool {
            guard let first = s.unicodeScalars.first,
                  first == "_" || (first.isASCII && first.properties.isAlphabetic) else {
                return false
            }
            return s.unicodeScalars.allSatisfy {
                $0 == "_"
                    || ($0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0)))
            }
        }
        for comp in m.components {
            for block in comp.blocks {
                let at = "manifest.json block \(comp.name)/\(block.name)"
                let variants = (block.variants ?? [:]).sorted { $0.key < $1.key }
                let suffix = Self.programSuffix[layout]!
                for (place, model) in [(at, block.model)]
                    + variants.map({ ("\(at) variant \($0.key)", $0.value.model) })
                where !model.hasSuffix(suffix) {
                    throw ManifestError.invalid("\(place): model \(model) is not " +
                                                "an \(suffix) (layout \(layout))")
                }
                let records = [(at, block.function)] + variants.map {
                    ("\(at) variant \($0.key)", $0.value.function)
                }
                for (place, function) in records {
                    guard let function else { continue }
                    if !Self.layoutsWithFunctions.contains(layout) {
                        throw ManifestError.invalid("\(place): function \(function) in " +
                                                    "a \(layout) layout (only a multifunction " +
                                                    "program has functions to choose from)")
                    }
                    if !isName(function) {
                        throw ManifestError.invalid("\(place): function \(function) " +
                                                    "is not a CoreML function name")
                    }
                }
                if variants.isEmpty { continue }
                if layout == "separate" {
                    for (name, v) in variants where v.model == block.model {
                        throw ManifestError.invalid("\(at) variant \(name): model \(v.model) is " +
                                                    "the block's own program; in the separate " +
                                                    "layout each variant is a program of its own")
                    }
                    continue
                }
                guard let main = block.function else {
                    throw ManifestError.invalid("\(at): a block with variants in " +
                                                "the \(layout) layout must name its function " +
                                                "of the shared program (field function)")
                }
                var seen = [main: "the block"]
                for (name, v) in variants {
                    if v.model != block.model {
                        throw ManifestError.invalid("\(at) variant \(name): model \(v.model) " +
                                                    "is not the block's \(block.model); in " +
                                                    "the \(layout) layout a variant is a " +
                                                    "function of its block's program")
                    }
                    guard let function = v.function else {
                        throw ManifestError.invalid("\(at) variant \(name): missing " +
                                                    "field function (which function " +
                                                    "of \(block.model) it runs)")
                    }
                    if let other = seen[function] {
                        throw ManifestError.invalid("\(at) variant \(name): " +
                                                    "function \(function) is also \(other)'s")
                    }
                    seen[function] = "variant \(name)"
                }
            }
        }
    }

    /// A decoding error as the manifest's own field path (snake_case, as written).
    static func describe(_ error: DecodingError) -> String {
        func field(_ path: [CodingKey], _ last: CodingKey? = nil) -> String {
            let keys = path + (last.map { [$0] } ?? [])
            return keys.map { $0.intValue.map { "[\($0)]" } ?? snakeCase($0.stringValue) }
                .joined(separator: ".").replacingOccurrences(of: ".[", with: "[")
        }
        switch error {
        case .keyNotFound(let key, let context):
            return "missing field \(field(context.codingPath, key))"
        case .typeMismatch(let type, let context), .valueNotFound(let type, let context):
            return "field \(field(context.codingPath)) must be \(type)"
        case .dataCorrupted(let context):
            return "field \(field(context.codingPath)): \(context.debugDescription)"
        @unknown default:
            return "\(error)"
        }
    }

    static func snakeCase(_ name: String) -> String {
        name.reduce(into: "") { out, ch in
            if ch.isUppercase { out += "_" + ch.lowercased() } else { out.append(ch) }
        }
    }
}
