import Foundation

/// The normalizers a T5 / UMT5 tokenizer.json uses, as the `tokenizers` library runs them.
/// Text travels as UTF-8 bytes: Swift's String compares and hashes by canonical
/// equivalence, and the Python side works on exact code points.
indirect enum TextNormalizer {
    case sequence([TextNormalizer])
    /// sentencepiece's `precompiled_charsmap` (nmt_nfkc and friends)
    case precompiled(PrecompiledCharsmap)
    case replace(ReplacePattern, content: [UInt8])
    case strip(left: Bool, right: Bool)

    static let supported = "Precompiled, Replace, Strip, Sequence"

    init(json: JSONValue, path: String) throws {
        guard let object = json.object else {
            throw TokenizerLoadError.invalid("\(path) is not an object")
        }
        let type = object["type"]?.string ?? ""
        switch type {
        case "Sequence":
            guard let items = object["normalizers"]?.array else {
                throw TokenizerLoadError.invalid("\(path).normalizers is missing")
            }
            self = .sequence(try items.enumerated().map {
                try TextNormalizer(json: $1, path: "\(path).normalizers[\($0)]")
            })
        case "Precompiled":
            guard let charsmap = object["precompiled_charsmap"]?.string else {
                throw TokenizerLoadError.invalid("\(path).precompiled_charsmap is missing")
            }
            self = .precompiled(try PrecompiledCharsmap(base64: charsmap, path: path))
        case "Replace":
            guard let content = object["content"]?.string,
                  let pattern = object["pattern"]?.object else {
                throw TokenizerLoadError.invalid("\(path) needs pattern and content")
            }
            self = .replace(try ReplacePattern(json: pattern, path: "\(path).pattern"),
                            content: Array(content.utf8))
        case "Strip":
            self = .strip(left: object["strip_left"]?.bool ?? true,
                          right: object["strip_right"]?.bool ?? true)
        default:
            throw TokenizerLoadError.unsupported(
                "\(path).type \(type.isEmpty ? "(none)" : type) is not " +
                "a supported normalizer (supported: \(Self.supported))")
        }
    }

    func apply(_ text: [UInt8]) -> [UInt8] {
        switch self {
        case .sequence(let steps):
            return steps.reduce(text) { $1.apply($0) }
        case .precompiled(let charsmap):
            return charsmap.normalize(text)
        case .replace(let pattern, let content):
            return pattern.replaceAll(in: text, with: content)
        case .strip(let left, let right):
            var scalars = Array(String(decoding: text, as: UTF8.self).unicodeScalars)
            if right {
                while let last = scalars.last, last.properties.isWhitespace { scalars.removeLast() }
            }
            if left, let first = scalars.firstIndex(where: { !$0.properties.isWhitespace }) {
                scalars.removeFirst(first)
            } else if left {
                scalars.removeAll()
            }
            return utf8(scalars)
        }
    }
}

func utf8<S: Sequence>(_ scalars: S) -> [UInt8] where S.Element == Unicode.Scalar {
    var out: [UInt8] = []
    for s in scalars { out.append(contentsOf: UTF8.encode(s)!) }
    return out
}

/// sentencepiece's precompiled normalization rules: a darts-clone double-array trie from
/// UTF-8 keys to offsets into a block of NUL-terminated replacement strings. Applied as
/// `tokenizers` does: per extended grapheme cluster, the whole cluster when it is under 6
/// bytes and some rule's key is a prefix of it (the shortest such rule's replacement stands
/// for the whole cluster), otherwise per character.
struct PrecompiledCharsmap {
    let trie: [UInt32]
    let replacements: [UInt8]

    init(base64: String, path: String) throws {
        guard let data = Data(base64Encoded: base64), data.count >= 4 else {
            throw TokenizerLoadError.invalid("\(path).precompiled_charsmap " +
                                             "is not a base64 charsmap")
        }
        let bytes = [UInt8](data)
        let trieBytes = Int(UInt32(bytes[0]) | UInt32(bytes[1]) << 8 | UInt32(bytes[2]) << 16
                            | UInt32(bytes[3]) << 24)
        guard trieBytes % 4 == 0, 4 + trieBytes <= bytes.count, trieBytes > 0 else {
            throw TokenizerLoadError.invalid("\(path).precompiled_charsmap: " +
                                             "bad trie size \(trieBytes)")
        }
        var units = [UInt32](repeating: 0, count: trieBytes / 4)
        for i in units.indices {
            let o = 4 + 4 * i
            units[i] = UInt32(bytes[o]) | UInt32(bytes[o + 1]) << 8 | UInt32(bytes[o + 2]) << 16
                | UInt32(bytes[o + 3]) << 24
        }
        trie = units
        replacements = Array(bytes[(4 + trieBytes)...])
    }

    @inline(__always) static func hasLeaf(_ unit: UInt32) -> Bool { (unit >> 8) & 1 == 1 }
    @inline(__always) static func value(_ unit: UInt32) -> Int { Int(unit & ((1 << 31) - 1)) }
    @inline(__always) static func label(_ unit: UInt32) -> UInt32 { unit & ((1 << 31) | 0xFF) }
    @inline(__always) static func offset(_ unit: UInt32) -> Int {
        Int((unit >> 10) << ((unit & (1 << 9)) >> 6))
    }

    /// The replacement of the shortest rule whose key is a prefix of `chunk`, if any.
    func transform(_ chunk: ArraySlice<UInt8>) -> ArraySlice<UInt8>? {
        var node = Self.offset(trie[0])
        for c in chunk {
            if c == 0 { break }
            node ^= Int(c)
            guard node >= 0, node < trie.count else { return nil }
            let unit = trie[node]
            if Self.label(unit) != UInt32(c) { return nil }
            node ^= Self.offset(unit)
            if Self.hasLeaf(unit) {
                guard node >= 0, node < trie.count else { return nil }
                let start = Self.value(trie[node])
                guard start < replacements.count else { return nil }
                var end = start
                while end < replacements.count, replacements[end] != 0 { end += 1 }
                return replacements[start..<end]
            }
        }
        return nil
    }

    func normalize(_ text: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(text.count)
        for cluster in String(decoding: text, as: UTF8.self) {
            let bytes = Array(cluster.utf8)
            if bytes.count < 6, let replacement = transform(bytes[...]) {
                out.append(contentsOf: replacement)
                continue
            }
            var i = 0
            for scalar in cluster.unicodeScalars {
                let part = bytes[i..<(i + UTF8.width(scalar))]
                out.append(contentsOf: transform(part) ?? part)
                i += part.count
            }
        }
        return out
    }
}

/// The pattern of a Replace normalizer: a string, or the regular expressions converters
/// write (" {2,}", "\A +| +\z", "\A▁"): alternatives of literal characters with greedy
/// quantifiers (*, +, ?, {n}, {n,}, {n,m}), `\A` and `\z` anchors. Other regular
/// expressions are refused rather than approximated.
struct ReplacePattern {
    struct Atom {
        let scalar: Unicode.Scalar
        let min: Int, max: Int
    }

    struct Branch {
        var atStart = false, atEnd = false
        var atoms: [Atom] = []
    }

    let branches: [Branch]

    init(json: [String: JSONValue], path: String) throws {
        if let literal = json["String"]?.string {
            guard !literal.isEmpty else {
                throw TokenizerLoadError.invalid("\(path).String is empty")
            }
            branches = [Branch(atoms: literal.unicodeScalars.map {
                Atom(scalar: $0, min: 1, max: 1)
            })]
        } else if let regex = json["Regex"]?.string {
            guard let parsed = Self.parse(regex) else {
                throw TokenizerLoadError.unsupported(
                    "\(path).Regex \"\(regex)\" is not supported (literal " +
                    "characters with quantifiers, | and \\A \\z anchors are)")
            }
            branches = parsed
        } else {
            throw TokenizerLoadError.invalid("\(path) needs String or Regex")
        }
    }

    static func parse(_ pattern: String) -> [Branch]? {
        let s = Array(pattern.unicodeScalars)
        var branches: [Branch] = [], branch = Branch(), i = 0
        func finish() -> Bool {
            // a branch that can match nothing would make Replace insert at every position
            guard branch.atoms.contains(where: { $0.min > 0 }) else { return false }
            branches.append(branch)
            branch = Branch()
            return true
        }
        while i < s.count {
            var c = s[i]
            i += 1
            if branch.atEnd && c != "|" { return nil }
            switch c {
            case "|":
                guard finish() else { return nil }
                continue
            case "\\":
                guard i < s.count else { return nil }
                let e = s[i]
                i += 1
                switch e {
                case "A":
                    guard branch.atoms.isEmpty, !branch.atStart else { return nil }
                    branch.atStart = true
                    continue
                case "z":
                    branch.atEnd = true
                    continue
                case "t": c = "\t"
                case "n": c = "\n"
                case "r": c = "\r"
                default:
                    // an escaped punctuation character or space stands for itself
                    guard e.isASCII, !e.properties.isAlphabetic, !("0"..."9").contains(e) else {
                        return nil
                    }
                    c = e
                }
            case ".", "^", "$", "[", "]", "(", ")", "{", "}", "*", "+", "?":
                return nil
            default:
                break
            }
            var lo = 1, hi = 1
            if i < s.count {
                switch s[i] {
                case "*": lo = 0; hi = .max; i += 1
                case "+": lo = 1; hi = .max; i += 1
                case "?": lo = 0; hi = 1; i += 1
                case "{":
                    guard let close = s[i...].firstIndex(of: "}") else { return nil }
                    let body = String(String.UnicodeScalarView(s[(i + 1)..<close]))
                    let parts = body.split(separator: ",", omittingEmptySubsequences: false)
                    guard let low = Int(parts[0]), parts.count <= 2 else { return nil }
                    lo = low
                    hi = parts.count == 1 ? low : (parts[1].isEmpty ? .max : (Int(parts[1]) ?? -1))
                    guard hi >= lo else { return nil }
                    i = close + 1
                default: break
                }
                // lazy and possessive quantifiers
                if (lo, hi) != (1, 1), i < s.count, s[i] == "?" || s[i] == "+" { return nil }
            }
            branch.atoms.append(Atom(scalar: c, min: lo, max: hi))
        }
        guard finish() else { return nil }
        return branches
    }

    /// Where `branch` matches from `start` (greedy, backtracking), the match's end.
    func match(_ branch: Branch, _ s: [Unicode.Scalar], _ atom: Int, _ pos: Int) -> Int? {
        if atom == branch.atoms.count { return !branch.atEnd || pos == s.count ? pos : nil }
        let a = branch.atoms[atom]
        var count = 0
        while count < a.max, pos + count < s.count, s[pos + count] == a.scalar { count += 1 }
        while count >= a.min {
            if let end = match(branch, s, atom + 1, pos + count) { return end }
            count -= 1
        }
        return nil
    }

    /// Every non-overlapping match, leftmost first, the first alternative that matches.
    func matches(_ s: [Unicode.Scalar]) -> [Range<Int>] {
        var found: [Range<Int>] = [], start = 0
        search: while start <= s.count {
            for from in start...s.count {
                for branch in branches where !branch.atStart || from == 0 {
                    if let end = match(branch, s, 0, from) {
                        found.append(from..<end)
                        start = end
                        continue search
                    }
                }
            }
            break
        }
        return found
    }

    func replaceAll(in text: [UInt8], with content: [UInt8]) -> [UInt8] {
        let scalars = Array(String(decoding: text, as: UTF8.self).unicodeScalars)
        let found = matches(scalars)
        guard !found.isEmpty else { return text }
        var out: [UInt8] = [], last = 0
        for range in found {
            out += utf8(scalars[last..<range.lowerBound])
            out += content
            last = range.upperBound
        }
        out += utf8(scalars[last...])
        return out
    }
}
