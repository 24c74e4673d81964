import Foundation

/// A package's caption tokenizer: what the Python runtime computes with
/// `edge.core.tokenizer.load_tokenizer(path, max_tokens, pad_token)` then
/// `tokenize(tok, [caption])`.
/// `encode` gives `maxTokens` ids and the attention mask (1 for tokens, 0 for padding); a
/// caption longer than that is truncated, keeping the end-of-caption token(s) the file's
/// post-processor adds.
public protocol CaptionTokenizer {
    var maxTokens: Int { get }
    func encode(_ caption: String) -> (ids: [Int32], mask: [Int32])
}

extension WordPieceTokenizer: CaptionTokenizer {}
extension UnigramTokenizer: CaptionTokenizer {}

/// Why a tokenizer.json cannot be used; the text names the field (as written in the file).
public enum TokenizerLoadError: Error, CustomStringConvertible, Equatable {
    case unsupported(String)
    case invalid(String)
    public var description: String {
        switch self {
        case .unsupported(let why): return "tokenizer.json: \(why)"
        case .invalid(let why): return "tokenizer.json: \(why)"
        }
    }
}

/// The tokenizer a package's `tokenizer.json` describes, chosen by its `model.type`:
/// "WordPiece" (tiny-sora's MiniLM) or "Unigram" (T5 / UMT5, Wan 2.1). `padToken` is the
/// manifest's `tokenizer.pad_token`; absent, "[PAD]" as in the Python runtime.
/// `embeddingRows` (the manifest's `tokenizer.embedding_rows`): a vocabulary larger than the
/// text encoder's embedding table is refused here, as the Python and web runtimes do, not on
/// the first prompt using a token past the table.
public func loadCaptionTokenizer(contentsOf url: URL, maxTokens: Int, padToken: String? = nil,
                                 embeddingRows: Int? = nil) throws -> any CaptionTokenizer {
    let data = try Data(contentsOf: url)
    let file = try TokenizerFile.decode(data)
    if let rows = embeddingRows {
        let size = try vocabularySize(ofTokenizerJSON: data)
        if size > rows {
            throw TokenizerLoadError.invalid("a vocabulary of \(size) tokens, but the " +
                                             "text encoder's embedding table " +
                                             "has \(rows) rows (manifest.json tokenizer " +
                                             "embedding_rows): ids past it index nothing")
        }
    }
    let pad = padToken ?? "[PAD]"
    switch file.model.type {
    case "Unigram":
        return try UnigramTokenizer(file: file, maxTokens: maxTokens, padToken: pad)
    case "WordPiece":
        return try WordPieceTokenizer(contentsOf: url, maxTokens: maxTokens, padToken: pad)
    case let other:
        throw TokenizerLoadError.unsupported(
            "model.type \(other) is not supported (supported: Unigram, WordPiece)")
    }
}

/// How many ids a tokenizer.json can give, as the tokenizers library's
/// `get_vocab_size(with_added_tokens=True)`: its model's vocabulary (a list for Unigram, a
/// map of token to id for WordPiece) and its added tokens, by their highest id.
public func vocabularySize(ofTokenizerJSON data: Data) throws -> Int {
    guard let body = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
          let model = body["model"] as? [String: Any] else {
        throw TokenizerLoadError.invalid("not a JSON object with a model")
    }
    var size: Int
    switch model["vocab"] {
    case let list as [Any]: size = list.count
    case let map as [String: Any]:
        size = (map.values.compactMap { ($0 as? NSNumber)?.intValue }.max() ?? -1) + 1
    default: throw TokenizerLoadError.invalid("model.vocab is neither a list nor a map")
    }
    for token in body["added_tokens"] as? [[String: Any]] ?? [] {
        if let id = (token["id"] as? NSNumber)?.intValue { size = max(size, id + 1) }
    }
    return size
}

// MARK: - prompt cleaning

/// How captions are cleaned before tokenizing (the manifest's `tokenizer.clean`), as
/// `edge.core.tokenizer.clean_prompt` does: "none" leaves them; "wan" (WanPipeline's prompt_clean
/// without ftfy) unescapes HTML entities twice as Python's `html.unescape` does, strips the
/// ends, collapses whitespace runs to one space (`re.sub(r"\s+", " ", text)`) and strips again.
/// Whitespace is Python's `str.isspace`; both tables come from Python (HTMLEntities.swift).
public enum PromptCleaner: String, CaseIterable, Sendable {
    case none
    case wan

    /// The cleaner a manifest names; absent, "none".
    public init(kind: String?) throws {
        guard let cleaner = PromptCleaner(rawValue: kind ?? "none") else {
            throw TokenizerLoadError.unsupported(
                "clean \(kind ?? "") is not a known prompt cleaner (known: none, wan)")
        }
        self = cleaner
    }

    public func clean(_ text: String) -> String {
        switch self {
        case .none: return text
        case .wan:
            var scalars = Array(text.unicodeScalars)
            scalars = HTMLUnescape.unescape(HTMLUnescape.unescape(scalars))
            scalars = PythonWhitespace.strip(
                PythonWhitespace.collapse(PythonWhitespace.strip(scalars)))
            var view = String.UnicodeScalarView()
            view.append(contentsOf: scalars)
            return String(view)
        }
    }
}

/// `edge.core.tokenizer.clean_prompt(text, kind)`; an unknown kind throws.
public func cleanPrompt(_ text: String, kind: String) throws -> String {
    try PromptCleaner(kind: kind).clean(text)
}

enum PythonWhitespace {
    static let set: Set<UInt32> = Set(
        PythonTextTables.whitespace.split(whereSeparator: \.isWhitespace)
            .map { UInt32($0, radix: 16)! })

    static func isSpace(_ s: Unicode.Scalar) -> Bool { set.contains(s.value) }

    /// str.strip()
    static func strip(_ s: [Unicode.Scalar]) -> [Unicode.Scalar] {
        guard let first = s.firstIndex(where: { !isSpace($0) }),
              let last = s.lastIndex(where: { !isSpace($0) }) else { return [] }
        return Array(s[first...last])
    }

    /// re.sub(r"\s+", " ", s)
    static func collapse(_ s: [Unicode.Scalar]) -> [Unicode.Scalar] {
        var out: [Unicode.Scalar] = []
        out.reserveCapacity(s.count)
        var inRun = false
        for c in s {
            if isSpace(c) {
                if !inRun { out.append(" ") }
                inRun = true
            } else {
                out.append(c)
                inRun = false
            }
        }
        return out
    }
}

/// Python's `html.unescape`: numeric character references (decimal and hexadecimal, with
/// its replacements for invalid code points) and named HTML5 references (the longest known
/// prefix of a name without ";" when the whole is not one).
enum HTMLUnescape {
    static let named: [String: [Unicode.Scalar]] = {
        var table: [String: [Unicode.Scalar]] = [:]
        for entry in PythonTextTables.named.split(whereSeparator: \.isWhitespace) {
            let parts = entry.split(separator: "=", maxSplits: 1)
            table[String(parts[0])] = scalars(parts[1])
        }
        return table
    }()

    static let invalidCharrefs: [UInt32: [Unicode.Scalar]] = {
        var table: [UInt32: [Unicode.Scalar]] = [:]
        for entry in PythonTextTables.invalidCharrefs.split(whereSeparator: \.isWhitespace) {
            let parts = entry.split(separator: "=", maxSplits: 1)
            table[UInt32(parts[0], radix: 16)!] = scalars(parts[1])
        }
        return table
    }()

    static let invalidCodepoints: Set<UInt32> = Set(PythonTextTables.invalidCodepoints
        .split(whereSeparator: \.isWhitespace).map { UInt32($0, radix: 16)! })

    static let longestName = named.keys.map(\.count).max() ?? 0

    static func scalars(_ hex: Substring) -> [Unicode.Scalar] {
        hex.split(separator: ",").map { Unicode.Scalar(UInt32($0, radix: 16)!)! }
    }

    static func isDigit(_ c: Unicode.Scalar) -> Bool { c.value >= 0x30 && c.value <= 0x39 }

    static func hexValue(_ c: Unicode.Scalar) -> UInt32? {
        switch c.value {
        case 0x30...0x39: return c.value - 0x30
        case 0x41...0x46: return c.value - 0x41 + 10
        case 0x61...0x66: return c.value - 0x61 + 10
        default: return nil
        }
    }

    static func unescape(_ s: [Unicode.Scalar]) -> [Unicode.Scalar] {
        guard s.contains("&") else { return s }
        var out: [Unicode.Scalar] = []
        out.reserveCapacity(s.count)
        var i = 0
        while i < s.count {
            if s[i] == "&", let (replacement, end) = reference(s, at: i + 1) {
                out.append(contentsOf: replacement)
                i = end
            } else {
                out.append(s[i])
                i += 1
            }
        }
        return out
    }

    /// The reference after an "&" at `start` (the regex
    /// `#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?`): its replacement and where
    /// the text after it starts; nil where it matches nothing.
    static func reference(_ s: [Unicode.Scalar], at start: Int) -> ([Unicode.Scalar], Int)? {
        guard start < s.count else { return nil }
        if s[start] == "#" {
            var i = start + 1
            var radix: UInt32 = 10
            if i < s.count, s[i] == "x" || s[i] == "X" {
                radix = 16
                i += 1
            }
            let digitsStart = i
            var value: UInt32 = 0   // saturates above 0x10FFFF: Python's int is unbounded
            while i < s.count,
                  let d = radix == 16 ? hexValue(s[i]) : (isDigit(s[i]) ? s[i].value - 0x30 : nil) {
                value = min(value * radix + d, 0x110000)
                i += 1
            }
            guard i > digitsStart else { return nil }
            if i < s.count, s[i] == ";" { i += 1 }
            return (numeric(value), i)
        }
        let excluded: Set<Unicode.Scalar> = ["\t", "\n", "\u{0C}", " ", "<", "&", "#", ";"]
        var i = start
        while i < s.count, i - start < 32, !excluded.contains(s[i]) { i += 1 }
        guard i > start else { return nil }
        if i < s.count, s[i] == ";" { i += 1 }
        return (named(Array(s[start..<i])), i)
    }

    static func numeric(_ value: UInt32) -> [Unicode.Scalar] {
        if let replacement = invalidCharrefs[value] { return replacement }
        if (0xD800...0xDFFF).contains(value) || value > 0x10FFFF { return ["\u{FFFD}"] }
        if invalidCodepoints.contains(value) { return [] }
        return [Unicode.Scalar(value)!]
    }

    static func lookup(_ name: ArraySlice<Unicode.Scalar>) -> [Unicode.Scalar]? {
        // every name is ASCII; a non-ASCII key must not meet them through String's
        // canonical equivalence (K KELVIN SIGN equals "K" there)
        guard name.count <= longestName, name.allSatisfy(\.isASCII) else { return nil }
        var view = String.UnicodeScalarView()
        view.append(contentsOf: name)
        return named[String(view)]
    }

    static func named(_ name: [Unicode.Scalar]) -> [Unicode.Scalar] {
        if let value = lookup(name[...]) { return value }
        var x = name.count - 1
        while x > 1 {
            if let value = lookup(name[..<x]) { return value + name[x...] }
            x -= 1
        }
        return ["&"] + name
    }
}
