import Foundation

/// A Unigram (sentencepiece T5 / UMT5) tokenizer read from a Hugging Face `tokenizers`
/// tokenizer.json, giving the ids and attention masks the Python runtime's `edge.core.tokenizer`
/// gives (the Wan 2.1 packages' captions). It does what `tokenizers` does, in its order:
///
/// 1. added tokens (`added_tokens`, e.g. `<pad>`, `</s>`, `<extra_id_0>`) are cut out of the
///    raw text (leftmost-longest; `single_word`, `lstrip`, `rstrip`), the rest normalized and
///    cut again by the `normalized` added tokens;
/// 2. the normalizer: null, or Precompiled (sentencepiece's charsmap), Replace, Strip in a
///    Sequence (PrecompiledNormalizer.swift);
/// 3. the pre-tokenizer: null, or Metaspace (prepend_scheme "always" or "never", split or
///    not) and WhitespaceSplit, alone or in a Sequence;
/// 4. the Unigram model: Viterbi over the pieces that match at each character, a character
///    no piece starts with costs the lowest score minus 10 as the unknown piece, adjacent
///    unknowns fuse into one; with `byte_fallback` an unknown piece becomes its `<0xNN>`
///    bytes when the vocabulary has them all;
/// 5. truncation to `maxTokens` less what the post-processor adds, the post-processor
///    (TemplateProcessing, e.g. "$A </s>", or null), padding with the pad token.
///
/// Anything else in the file (another model, normalizer, pre-tokenizer or post-processor,
/// prepend_scheme "first", a regular expression beyond the converters' simple ones) is
/// refused with an error naming the field.
public struct UnigramTokenizer {
    public let maxTokens: Int
    public let padId: Int32
    let model: UnigramModel
    let normalizer: TextNormalizer?
    let preTokenizers: [PreTokenizer]
    let rawAdded: AddedTokenMatcher
    let normalizedAdded: AddedTokenMatcher
    let template: [TemplateItem]
    let templateTokens: Int

    enum TemplateItem {
        case sequence
        case special([Int32])
    }

    public init(contentsOf url: URL, maxTokens: Int, padToken: String) throws {
        try self.init(data: Data(contentsOf: url), maxTokens: maxTokens, padToken: padToken)
    }

    public init(data: Data, maxTokens: Int, padToken: String) throws {
        try self.init(file: TokenizerFile.decode(data), maxTokens: maxTokens, padToken: padToken)
    }

    init(file: TokenizerFile, maxTokens: Int, padToken: String) throws {
        guard let spec = file.model.unigram else {
            throw TokenizerLoadError.unsupported("model.type \(file.model.type) is not Unigram")
        }
        model = try UnigramModel(spec)

        let normalizer = try file.normalizer.flatMap { json -> TextNormalizer? in
            if case .null = json { return nil }
            return try TextNormalizer(json: json, path: "normalizer")
        }
        self.normalizer = normalizer
        preTokenizers = try file.pre_tokenizer.map {
            try PreTokenizer.parse($0, path: "pre_tokenizer")
        } ?? []

        // added tokens: the special ones first, then the others, each in the file's order
        let added = (file.added_tokens ?? []).filter { !$0.content.isEmpty }
        let ordered = added.filter { $0.special == true } + added.filter { $0.special != true }
        rawAdded = AddedTokenMatcher(ordered.filter { !$0.isNormalized }.map {
            .init(bytes: Array($0.content.utf8), spec: $0)
        })
        normalizedAdded = AddedTokenMatcher(ordered.filter(\.isNormalized).map {
            let content = Array($0.content.utf8)
            return .init(bytes: normalizer?.apply(content) ?? content, spec: $0)
        })

        (template, templateTokens) = try Self.parseTemplate(file.post_processor)
        guard maxTokens >= max(1, templateTokens) else {
            throw TokenizerLoadError.invalid(
                "max_tokens \(maxTokens) leaves no room: the " +
                "post_processor adds \(templateTokens) token(s)")
        }
        self.maxTokens = maxTokens
        let pad = added.last(where: { $0.content == padToken }).map { Int32($0.id) }
            ?? model.pieces.lookup(Array(padToken.utf8)[...])
        guard let pad else {
            throw TokenizerLoadError.invalid("no pad token \(padToken) in the vocabulary")
        }
        padId = pad
    }

    static func parseTemplate(_ json: JSONValue?) throws -> ([TemplateItem], Int) {
        guard let json, case .object(let object) = json else { return ([.sequence], 0) }
        let type = object["type"]?.string ?? ""
        guard type == "TemplateProcessing" else {
            throw TokenizerLoadError.unsupported(
                "post_processor.type \(type.isEmpty ? "(none)" : type) " +
                "is not supported (supported: TemplateProcessing)")
        }
        guard let single = object["single"]?.array else {
            throw TokenizerLoadError.invalid("post_processor.single is missing")
        }
        let specials = object["special_tokens"]?.object ?? [:]
        var items: [TemplateItem] = [], count = 0, sequences = 0
        for (i, item) in single.enumerated() {
            if let sequence = item["Sequence"]?.object {
                guard sequence["id"]?.string == "A" else {
                    throw TokenizerLoadError.unsupported(
                        "post_processor.single[\(i)]: only sequence A in a single template")
                }
                items.append(.sequence)
                sequences += 1
            } else if let name = item["SpecialToken"]?["id"]?.string {
                guard let ids = specials[name]?["ids"]?.array?.compactMap(\.int) else {
                    throw TokenizerLoadError.invalid("post_processor.special_tokens has no \(name)")
                }
                items.append(.special(ids.map { Int32($0) }))
                count += ids.count
            } else {
                throw TokenizerLoadError.invalid("post_processor.single[\(i)] is " +
                                                 "neither Sequence nor SpecialToken")
            }
        }
        guard sequences == 1 else {
            throw TokenizerLoadError.unsupported("post_processor.single must hold $A once")
        }
        return (items, count)
    }

    /// The ids `tokenizers` gives `text` without special tokens, truncation or padding.
    public func tokenIds(_ text: String) -> [Int32] {
        var segments = rawAdded.split(Array(text.utf8))
        segments = segments.flatMap { segment -> [Segment] in
            guard case .text(let bytes) = segment else { return [segment] }
            return normalizedAdded.split(normalizer?.apply(bytes) ?? bytes)
        }
        for step in preTokenizers {
            segments = segments.flatMap { segment -> [Segment] in
                guard case .text(let bytes) = segment else { return [segment] }
                return step.split(bytes).filter { !$0.isEmpty }.map { .text($0) }
            }
        }
        return segments.flatMap { segment -> [Int32] in
            switch segment {
            case .token(let id): return [id]
            case .text(let bytes): return model.tokenize(bytes)
            }
        }
    }

    /// (input_ids, attention_mask) of one caption, `maxTokens` each: the tokens cut to fit
    /// with what the post-processor adds, then padded with the pad token.
    public func encode(_ caption: String) -> (ids: [Int32], mask: [Int32]) {
        let tokens = tokenIds(caption).prefix(maxTokens - templateTokens)
        var ids: [Int32] = []
        ids.reserveCapacity(maxTokens)
        for item in template {
            switch item {
            case .sequence: ids.append(contentsOf: tokens)
            case .special(let special): ids.append(contentsOf: special)
            }
        }
        let padding = max(0, maxTokens - ids.count)
        return (ids + [Int32](repeating: padId, count: padding),
                [Int32](repeating: 1, count: ids.count) + [Int32](repeating: 0, count: padding))
    }
}

enum Segment {
    case text([UInt8])
    case token(Int32)
}

// MARK: - pre-tokenizers

enum PreTokenizer {
    /// split at Unicode whitespace, which is dropped
    case whitespaceSplit
    /// spaces become `replacement`, which is prepended when missing ("always"); `split`
    /// cuts before every replacement character
    case metaspace(replacement: [UInt8], prepend: Bool, split: Bool)

    static let supported = "Metaspace, WhitespaceSplit, Sequence"

    static func parse(_ json: JSONValue, path: String) throws -> [PreTokenizer] {
        if case .null = json { return [] }
        guard let object = json.object else {
            throw TokenizerLoadError.invalid("\(path) is not an object")
        }
        let type = object["type"]?.string ?? ""
        switch type {
        case "Sequence":
            guard let items = object["pretokenizers"]?.array else {
                throw TokenizerLoadError.invalid("\(path).pretokenizers is missing")
            }
            return try items.enumerated().flatMap {
                try parse($1, path: "\(path).pretokenizers[\($0)]")
            }
        case "WhitespaceSplit":
            return [.whitespaceSplit]
        case "Metaspace":
            guard let replacement = object["replacement"]?.string,
                  replacement.unicodeScalars.count == 1 else {
                throw TokenizerLoadError.invalid("\(path).replacement must be one character")
            }
            // tokenizers: prepend_scheme defaults to "always"; the older add_prefix_space
            // must agree with it
            let scheme = object["prepend_scheme"]?.string ?? "always"
            guard scheme == "always" || scheme == "never" else {
                throw TokenizerLoadError.unsupported(
                    "\(path).prepend_scheme \(scheme) is not supported (supported: always, never)")
            }
            if let legacy = object["add_prefix_space"]?.bool, legacy != (scheme != "never") {
                throw TokenizerLoadError.invalid("\(path).add_prefix_space does " +
                                                 "not match prepend_scheme \(scheme)")
            }
            return [.metaspace(replacement: Array(replacement.utf8), prepend: scheme == "always",
                               split: object["split"]?.bool ?? true)]
        default:
            throw TokenizerLoadError.unsupported(
                "\(path).type \(type.isEmpty ? "(none)" : type) is not " +
                "a supported pre-tokenizer (supported: \(supported))")
        }
    }

    func split(_ text: [UInt8]) -> [[UInt8]] {
        switch self {
        case .whitespaceSplit:
            var words: [[UInt8]] = [], current: [UInt8] = []
            for scalar in String(decoding: text, as: UTF8.self).unicodeScalars {
                if scalar.properties.isWhitespace {
                    if !current.isEmpty { words.append(current); current = [] }
                } else {
                    current.append(contentsOf: UTF8.encode(scalar)!)
                }
            }
            if !current.isEmpty { words.append(current) }
            return words
        case .metaspace(let replacement, let prepend, let split):
            var text = text.flatMap { $0 == 0x20 ? replacement : [$0] }
            if prepend && !text.starts(with: replacement) { text = replacement + text }
            guard split else { return [text] }
            var pieces: [[UInt8]] = [], start = 0, i = 0
            while i + replacement.count <= text.count {
                if text[i..<(i + replacement.count)].elementsEqual(replacement) {
                    if i > start { pieces.append(Array(text[start..<i])) }
                    start = i
                    i += replacement.count
                } else {
                    i += 1
                }
            }
            if start < text.count { pieces.append(Array(text[start...])) }
            return pieces
        }
    }
}

// MARK: - added tokens

/// The parts of a tokenizer.json this runtime reads, decoded in one pass.
struct TokenizerFile: Decodable {
    struct Model: Decodable {
        let type: String
        /// the vocabulary and settings when `type` is "Unigram"
        let unigram: UnigramModel.Spec?

        enum Keys: String, CodingKey { case type }

        init(from decoder: Decoder) throws {
            type = try decoder.container(keyedBy: Keys.self).decode(String.self, forKey: .type)
            unigram = type == "Unigram" ? try UnigramModel.Spec(from: decoder) : nil
        }
    }

    let model: Model
    let normalizer: JSONValue?
    let pre_tokenizer: JSONValue?
    let post_processor: JSONValue?
    let added_tokens: [AddedTokenSpec]?

    static func decode(_ data: Data) throws -> TokenizerFile {
        do {
            return try JSONDecoder().decode(TokenizerFile.self, from: data)
        } catch let error as DecodingError {
            let path: [CodingKey]
            switch error {
            case .keyNotFound(let key, let context): path = context.codingPath + [key]
            case .typeMismatch(_, let context), .valueNotFound(_, let context),
                 .dataCorrupted(let context):
                path = context.codingPath
            @unknown default: path = []
            }
            let field = path.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined()
            throw TokenizerLoadError.invalid(field.isEmpty ? "not a tokenizers file"
                                             : "field \(field.dropFirst()) is missing or malformed")
        }
    }
}

struct AddedTokenSpec: Decodable {
    let id: Int
    let content: String
    let single_word: Bool?
    let lstrip: Bool?
    let rstrip: Bool?
    let normalized: Bool?
    let special: Bool?

    var isNormalized: Bool { normalized ?? (special != true) }
}

/// The added tokens found in a text the way `tokenizers`' AddedVocabulary finds them.
struct AddedTokenMatcher {
    struct Pattern {
        let bytes: [UInt8]
        let id: Int32
        let singleWord: Bool, lstrip: Bool, rstrip: Bool

        init(bytes: [UInt8], spec: AddedTokenSpec) {
            self.bytes = bytes
            id = Int32(spec.id)
            singleWord = spec.single_word ?? false
            lstrip = spec.lstrip ?? false
            rstrip = spec.rstrip ?? false
        }
    }

    let patterns: [Pattern]
    let byFirstByte: [UInt8: [Int]]

    init(_ patterns: [Pattern]) {
        self.patterns = patterns.filter { !$0.bytes.isEmpty }
        var index: [UInt8: [Int]] = [:]
        for (i, p) in self.patterns.enumerated() { index[p.bytes[0], default: []].append(i) }
        byFirstByte = index
    }

    /// The leftmost match at or after `from`, the longest of those starting there.
    func nextMatch(_ text: [UInt8], from: Int) -> (start: Int, pattern: Int)? {
        guard !patterns.isEmpty else { return nil }
        var start = from
        while start < text.count {
            var best: Int?
            for i in byFirstByte[text[start]] ?? [] {
                let p = patterns[i].bytes
                if start + p.count <= text.count, text[start..<(start + p.count)].elementsEqual(p),
                   best.map({ patterns[$0].bytes.count < p.count }) ?? true {
                    best = i
                }
            }
            if let best { return (start, best) }
            start += 1
        }
        return nil
    }

    /// `text` cut into added tokens and the (non-empty) text between them.
    func split(_ text: [UInt8]) -> [Segment] {
        var segments: [Segment] = [], offset = 0, searchFrom = 0
        while let (matchStart, index) = nextMatch(text, from: searchFrom) {
            let pattern = patterns[index]
            var start = matchStart, stop = matchStart + pattern.bytes.count
            searchFrom = stop
            if pattern.singleWord {
                let before = String(decoding: text[..<start], as: UTF8.self).unicodeScalars.last
                let after = String(decoding: text[stop...], as: UTF8.self).unicodeScalars.first
                if before.map(Self.isWordCharacter) == true
                    || after.map(Self.isWordCharacter) == true {
                    continue
                }
            }
            if pattern.lstrip {
                var newStart = start
                for scalar in String(decoding: text[..<start], as: UTF8.self).unicodeScalars
                    .reversed() {
                    guard scalar.properties.isWhitespace else { break }
                    newStart -= UTF8.width(scalar)
                }
                start = max(newStart, offset)
            }
            if pattern.rstrip {
                for scalar in String(decoding: text[stop...], as: UTF8.self).unicodeScalars {
                    guard scalar.properties.isWhitespace else { break }
                    stop += UTF8.width(scalar)
                }
            }
            if offset < start { segments.append(.text(Array(text[offset..<start]))) }
            segments.append(.token(pattern.id))
            offset = stop
        }
        if offset < text.count { segments.append(.text(Array(text[offset...]))) }
        return segments
    }

    /// The regex crate's Unicode `\w`.
    static func isWordCharacter(_ s: Unicode.Scalar) -> Bool {
        let p = s.properties
        if p.isAlphabetic || p.isJoinControl { return true }
        switch p.generalCategory {
        case .nonspacingMark, .spacingMark, .enclosingMark, .decimalNumber, .connectorPunctuation:
            return true
        default: return false
        }
    }
}

// MARK: - the Unigram model

/// The vocabulary's pieces as UTF-8, sorted, for prefix searches without a trie of nodes
/// (UMT5 has 256k pieces). A piece listed twice takes its last id, as in `tokenizers`.
struct PieceTable {
    let bytes: [UInt8]
    let starts: [Int]
    let lengths: [Int]
    /// ids in the pieces' byte order, one per distinct piece
    let order: [Int32]

    init<S: Sequence>(_ pieces: S) where S.Element == String {
        var flat: [UInt8] = [], starts: [Int] = [], lengths: [Int] = []
        for p in pieces {
            starts.append(flat.count)
            flat.append(contentsOf: p.utf8)
            lengths.append(flat.count - starts[starts.count - 1])
        }
        // byte order, then id: equal pieces end up side by side, the last id last
        let sorted = flat.withUnsafeBufferPointer { buffer in
            starts.indices.sorted { a, b in
                let la = lengths[a], lb = lengths[b]
                let c = la == 0 || lb == 0 ? 0 : memcmp(buffer.baseAddress! + starts[a],
                                                        buffer.baseAddress! + starts[b],
                                                        min(la, lb))
                if c != 0 { return c < 0 }
                return la != lb ? la < lb : a < b
            }
        }
        var order: [Int32] = []
        order.reserveCapacity(sorted.count)
        for (k, i) in sorted.enumerated() {
            if k + 1 < sorted.count, lengths[sorted[k + 1]] == lengths[i],
               flat[starts[i]..<(starts[i] + lengths[i])].elementsEqual(
                   flat[starts[sorted[k + 1]]..<(starts[sorted[k + 1]] + lengths[i])]) { continue }
            order.append(Int32(i))
        }
        bytes = flat
        self.starts = starts
        self.lengths = lengths
        self.order = order
    }

    @inline(__always) func byte(_ k: Int, _ depth: Int) -> UInt8 {
        bytes[starts[Int(order[k])] + depth]
    }

    @inline(__always) func length(_ k: Int) -> Int { lengths[Int(order[k])] }

    /// Calls `found(length, id)` for every piece that is a prefix of `text[from...]`,
    /// shortest first.
    func prefixes(of text: [UInt8], from: Int, _ found: (Int, Int32) -> Void) {
        var lo = 0, hi = order.count, depth = 0
        while from + depth < text.count, lo < hi {
            // the range shares `depth` bytes; a piece that ends there sorts first
            if length(lo) == depth { lo += 1 }
            let b = text[from + depth]
            var l = lo, h = hi
            while l < h {
                let m = (l + h) / 2
                if byte(m, depth) < b { l = m + 1 } else { h = m }
            }
            lo = l
            h = hi
            while l < h {
                let m = (l + h) / 2
                if byte(m, depth) <= b { l = m + 1 } else { h = m }
            }
            hi = l
            depth += 1
            if lo < hi, length(lo) == depth { found(depth, order[lo]) }
        }
    }

    func lookup(_ key: ArraySlice<UInt8>) -> Int32? {
        let key = Array(key)
        var result: Int32?
        prefixes(of: key, from: 0) { length, id in if length == key.count { result = id } }
        return result
    }
}

struct UnigramModel {
    struct Spec: Decodable {
        struct Piece: Decodable {
            let text: String
            let score: Double
            init(from decoder: Decoder) throws {
                var c = try decoder.unkeyedContainer()
                text = try c.decode(String.self)
                score = try c.decode(Double.self)
            }
        }
        let vocab: [Piece]
        let unk_id: Int?
        let byte_fallback: Bool?
    }

    let pieces: PieceTable
    let scores: [Double]
    let unkId: Int32
    let unkScore: Double
    /// the `<0xNN>` pieces' ids when `byte_fallback` is on
    let byteIds: [Int32?]?

    init(_ spec: Spec) throws {
        guard !spec.vocab.isEmpty else { throw TokenizerLoadError.invalid("model.vocab is empty") }
        guard let unk = spec.unk_id else {
            throw TokenizerLoadError.unsupported("model.unk_id null is not supported")
        }
        guard unk >= 0, unk < spec.vocab.count else {
            throw TokenizerLoadError.invalid("model.unk_id \(unk) is not in the vocabulary")
        }
        pieces = PieceTable(spec.vocab.lazy.map(\.text))
        scores = spec.vocab.map(\.score)
        unkId = Int32(unk)
        unkScore = (scores.min() ?? 0) - 10
        if spec.byte_fallback == true {
            let table = pieces
            byteIds = (0..<256).map { (byte: Int) -> Int32? in
                let hex = String(byte, radix: 16, uppercase: true)
                return table.lookup(Array("<0x\(byte < 16 ? "0" : "")\(hex)>".utf8)[...])
            }
        } else {
            byteIds = nil
        }
    }

    @inline(__always) static func characterLength(_ lead: UInt8) -> Int {
        lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4
    }

    /// The best segmentation of one pre-tokenized word, as ids.
    func tokenize(_ text: [UInt8]) -> [Int32] {
        let n = text.count
        guard n > 0 else { return [] }
        var score = [Double](repeating: 0, count: n + 1)
        var startAt = [Int](repeating: -1, count: n + 1)
        var ids = [Int32](repeating: 0, count: n + 1)
        var pos = 0
        while pos < n {
            let base = score[pos]
            let charLength = min(Self.characterLength(text[pos]), n - pos)
            var single = false
            pieces.prefixes(of: text, from: pos) { length, id in
                let end = pos + length, candidate = scores[Int(id)] + base
                if startAt[end] < 0 || candidate > score[end] {
                    score[end] = candidate
                    startAt[end] = pos
                    ids[end] = id
                }
                if length == charLength { single = true }
            }
            if !single {
                let end = pos + charLength, candidate = unkScore + base
                if startAt[end] < 0 || candidate > score[end] {
                    score[end] = candidate
                    startAt[end] = pos
                    ids[end] = unkId
                }
            }
            pos += charLength
        }
        // back from the end; adjacent unknown pieces fuse into one
        var spans: [(Range<Int>, Int32?)] = []
        var end = n, unknownStart: Int?, unknownEnd = n
        while end > 0 {
            let start = startAt[end]
            if ids[end] == unkId {
                if unknownStart == nil { unknownEnd = end }
                unknownStart = start
            } else {
                if let s = unknownStart { spans.append((s..<unknownEnd, nil)); unknownStart = nil }
                spans.append((start..<end, ids[end]))
            }
            end = start
        }
        if let s = unknownStart { spans.append((s..<unknownEnd, nil)) }
        var out: [Int32] = []
        for (range, id) in spans.reversed() {
            if let id {
                out.append(id)
            } else if let id = pieces.lookup(text[range]) {
                out.append(id)
            } else if let byteIds, case let bytes = text[range].map({ byteIds[Int($0)] }),
                      !bytes.contains(where: { $0 == nil }) {
                out.append(contentsOf: bytes.compactMap { $0 })
            } else {
                out.append(unkId)
            }
        }
        return out
    }
}

// MARK: - JSON

/// A JSON value, for the parts of tokenizer.json whose shape depends on their "type".
enum JSONValue: Decodable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    init(from decoder: Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let v = try? c.decode(Bool.self) { self = .bool(v) }
        else if let v = try? c.decode(Double.self) { self = .number(v) }
        else if let v = try? c.decode(String.self) { self = .string(v) }
        else if let v = try? c.decode([JSONValue].self) { self = .array(v) }
        else { self = .object(try c.decode([String: JSONValue].self)) }
    }

    subscript(key: String) -> JSONValue? { object?[key] }
    var object: [String: JSONValue]? {
        if case .object(let v) = self { return v } else { return nil }
    }
    var array: [JSONValue]? { if case .array(let v) = self { return v } else { return nil } }
    var string: String? { if case .string(let v) = self { return v } else { return nil } }
    var bool: Bool? { if case .bool(let v) = self { return v } else { return nil } }
    var int: Int? {
        if case .number(let v) = self, v == v.rounded(), abs(v) < 1e15 { return Int(v) }
        return nil
    }
}
