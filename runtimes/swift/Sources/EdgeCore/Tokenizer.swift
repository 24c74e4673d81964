import Foundation

/// Caption tokenisation from the package's `tokenizer.json` (the Hugging Face `tokenizers`
/// file the Python runtime loads). The approach: a small hand-written BERT WordPiece
/// tokenizer that reads the vocabulary and settings from that file and implements what
/// tiny-sora's MiniLM tokenizer uses: BertNormalizer (clean text, CJK spacing, accent
/// stripping, lowercase), BertPreTokenizer (whitespace and punctuation splits), greedy
/// longest-match WordPiece with "##" continuations, `[CLS] ... [SEP]`, truncation and
/// padding to `max_tokens`. Any other tokenizer type in the file is refused rather than
/// approximated. XCTests compare it with the Python tokenizer's ids (tests/fixtures/swift).
public struct WordPieceTokenizer {
    public enum LoadError: Error, CustomStringConvertible {
        case unsupported(String)
        public var description: String {
            switch self { case .unsupported(let why): return "tokenizer.json: \(why)" }
        }
    }

    let vocab: [String: Int32]
    let unknown: Int32, cls: Int32, sep: Int32, pad: Int32
    let prefix: String
    let maxCharsPerWord: Int
    let lowercase: Bool, stripAccents: Bool
    public let maxTokens: Int

    /// `padToken`: the pad token's id pads (as the Python runtime's `load_tokenizer` does);
    /// nil: the file's `padding.pad_id`, else 0.
    public init(contentsOf url: URL, maxTokens: Int, padToken: String? = nil) throws {
        let json = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as? [String: Any]
            ?? [:]
        guard let model = json["model"] as? [String: Any], model["type"] as? String == "WordPiece",
              let raw = model["vocab"] as? [String: Int] else {
            throw LoadError.unsupported("only WordPiece models are supported")
        }
        let normalizer = json["normalizer"] as? [String: Any] ?? [:]
        guard normalizer["type"] as? String == "BertNormalizer" else {
            throw LoadError.unsupported("only the BertNormalizer is supported")
        }
        let vocabulary = raw.mapValues { Int32($0) }
        func id(_ token: String) throws -> Int32 {
            guard let v = vocabulary[token] else {
                throw LoadError.unsupported("no \(token) in the vocabulary")
            }
            return v
        }
        vocab = vocabulary
        unknown = try id(model["unk_token"] as? String ?? "[UNK]")
        cls = try id("[CLS]")
        sep = try id("[SEP]")
        pad = try padToken.map(id)
            ?? Int32((json["padding"] as? [String: Any])?["pad_id"] as? Int ?? 0)
        prefix = model["continuing_subword_prefix"] as? String ?? "##"
        maxCharsPerWord = model["max_input_chars_per_word"] as? Int ?? 100
        lowercase = normalizer["lowercase"] as? Bool ?? true
        // tokenizers: strip_accents null follows lowercase
        stripAccents = normalizer["strip_accents"] as? Bool ?? lowercase
        self.maxTokens = maxTokens
    }

    func normalize(_ text: String) -> String {
        var out = String.UnicodeScalarView()
        for s in text.unicodeScalars {
            if s.value == 0 || s.value == 0xFFFD { continue }
            if s == "\t" || s == "\n" || s == "\r"
                || s.properties.generalCategory == .spaceSeparator {
                out.append(" ")
            } else if s.properties.generalCategory == .control
                        || s.properties.generalCategory == .format {
                continue
            } else if Self.isCJK(s) {
                out.append(" "); out.append(s); out.append(" ")
            } else {
                out.append(s)
            }
        }
        var result = String(out)
        if stripAccents {
            result = String(String.UnicodeScalarView(
                result.decomposedStringWithCanonicalMapping.unicodeScalars
                    .filter { $0.properties.generalCategory != .nonspacingMark }))
        }
        return lowercase ? result.lowercased() : result
    }

    static func isCJK(_ s: Unicode.Scalar) -> Bool {
        let v = s.value
        return (0x4E00...0x9FFF).contains(v) || (0x3400...0x4DBF).contains(v)
            || (0x20000...0x2A6DF).contains(v) || (0x2A700...0x2B73F).contains(v)
            || (0x2B740...0x2B81F).contains(v) || (0x2B820...0x2CEAF).contains(v)
            || (0xF900...0xFAFF).contains(v) || (0x2F800...0x2FA1F).contains(v)
    }

    static func isPunctuation(_ s: Unicode.Scalar) -> Bool {
        let v = s.value
        if (33...47).contains(v) || (58...64).contains(v) || (91...96).contains(v)
            || (123...126).contains(v) {
            return true
        }
        switch s.properties.generalCategory {
        case .connectorPunctuation, .dashPunctuation, .openPunctuation, .closePunctuation,
             .initialPunctuation, .finalPunctuation, .otherPunctuation: return true
        default: return false
        }
    }

    /// BertPreTokenizer: split on whitespace; every punctuation character is its own word.
    func words(_ text: String) -> [String] {
        var words: [String] = [], current = String.UnicodeScalarView()
        func flush() { if !current.isEmpty { words.append(String(current)); current = .init() } }
        for s in text.unicodeScalars {
            if s.properties.isWhitespace { flush() }
            else if Self.isPunctuation(s) { flush(); words.append(String(s)) }
            else { current.append(s) }
        }
        flush()
        return words
    }

    /// Greedy longest-match WordPiece; a word with no full match is one [UNK].
    func pieces(_ word: String) -> [Int32] {
        let chars = Array(word.unicodeScalars)
        if chars.count > maxCharsPerWord { return [unknown] }
        var ids: [Int32] = [], start = 0
        while start < chars.count {
            var end = chars.count, found: Int32?
            while start < end {
                var piece = String(String.UnicodeScalarView(chars[start..<end]))
                if start > 0 { piece = prefix + piece }
                if let id = vocab[piece] { found = id; break }
                end -= 1
            }
            guard let id = found else { return [unknown] }
            ids.append(id)
            start = end
        }
        return ids
    }

    /// (input_ids, attention_mask) of one caption, `maxTokens` each: [CLS] tokens [SEP],
    /// truncated to fit, padded with the pad id.
    public func encode(_ text: String) -> (ids: [Int32], mask: [Int32]) {
        var tokens = words(normalize(text)).flatMap(pieces)
        tokens = Array(tokens.prefix(max(0, maxTokens - 2)))
        let ids = [cls] + tokens + [sep]
        let padding = maxTokens - ids.count
        return (ids + [Int32](repeating: pad, count: padding),
                [Int32](repeating: 1, count: ids.count) + [Int32](repeating: 0, count: padding))
    }
}
