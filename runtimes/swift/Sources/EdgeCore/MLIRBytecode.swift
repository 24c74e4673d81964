import Foundation

/// The framing of an MLIR bytecode file (a Core AI program's `main.mlirb`), checked without
/// parsing it: the magic number, the version, the producer, then sections that must cover the
/// file exactly, each present at most once, the ones every module has all there. The Swift
/// mirror of edge/core/mlir_bytecode.py (same rules, same messages).
///
/// Why by hand: Core AI's Linux runtime parses the file in native code and aborts the process
/// on one that ends early; the runtime refuses such a program before Core AI sees it, and no
/// library reads MLIR's bytecode framing. The format is MLIR's (mlir/docs/BytecodeFormat.md):
///
///     file    = "ML\u{EF}R" varint(version) producer-string-NUL section*
///     section = byte(id | aligned << 7) varint(length) [varint(alignment) 0xCB-padding] data
public enum MLIRBytecode {
    public struct FramingError: Error, CustomStringConvertible, Equatable {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    public struct Section: Equatable {
        public let id: Int
        public let header: Int   // offset of its header
        public let end: Int      // offset past its data
    }

    static let magic: [UInt8] = [0x4D, 0x4C, 0xEF, 0x52]
    static let padding: UInt8 = 0xCB
    /// Section ids every module's bytecode has; from version 5 (native properties encoding)
    /// the properties too. Resources (5) and their offsets (6) come together.
    static let required: [(Int, String)] = [(0, "string"), (1, "dialect"),
                                            (2, "attribute/type"),
                                            (3, "attribute/type offset"), (4, "IR")]
    static let properties = 8, propertiesFromVersion: UInt64 = 5
    static let maxProducer = 256

    /// The version and the sections of `data` in file order; throws where they do not cover
    /// it exactly.
    public static func sections(of data: Data) throws -> (version: UInt64, sections: [Section]) {
        let bytes = [UInt8](data.prefix(4))
        guard bytes == magic else {
            throw FramingError("does not begin with MLIR bytecode's magic number")
        }
        var at = 4
        let version = try varint(data, &at, "the version")
        let producer = data.dropFirst(at).prefix(maxProducer)
        guard let nul = producer.firstIndex(of: 0) else {
            throw FramingError(producer.count < maxProducer ? "ends inside the producer string"
                               : "has no producer string")
        }
        at = nul - data.startIndex + 1
        var found: [Section] = []
        while at < data.count {
            let header = at, byte = data[data.startIndex + at]
            let id = Int(byte & 0x7F), aligned = byte >> 7 == 1
            let what = "section \(id) (at byte \(header))"
            at += 1
            if found.contains(where: { $0.id == id }) { throw FramingError("has \(what) twice") }
            let length = try varint(data, &at, "the length of \(what)")
            if aligned {
                let alignment = try varint(data, &at, "the alignment of \(what)")
                guard alignment >= 1, alignment & (alignment - 1) == 0,
                      alignment <= UInt64(data.count) else {
                    throw FramingError("gives \(what) an alignment of \(alignment)")
                }
                let pad = (Int(alignment) - at % Int(alignment)) % Int(alignment)
                guard at + pad <= data.count, data.dropFirst(at).prefix(pad)
                    .allSatisfy({ $0 == padding }) else {
                    throw FramingError("pads \(what) with bytes other than 0xCB")
                }
                at += pad
            }
            guard length <= UInt64(data.count - at) else {
                let short = length - UInt64(data.count - at)
                throw FramingError("ends \(short) bytes before the end of \(what) " +
                                   "(\(length) bytes): truncated")
            }
            at += Int(length)
            found.append(Section(id: id, header: header, end: at))
        }
        return (version, found)
    }

    /// Throws unless `data` is whole MLIR bytecode: sections that cover it exactly, every
    /// one a module has among them (a cut on a section's boundary leaves whole sections).
    public static func checkFraming(_ data: Data) throws {
        let (version, found) = try sections(of: data)
        let seen = Set(found.map(\.id))
        let needed = required + (version >= propertiesFromVersion ? [(properties, "properties")]
                                 : [])
        let missing = needed.filter { !seen.contains($0.0) }.map { "\($0.1) (\($0.0))" }
        if !missing.isEmpty {
            throw FramingError("has no \(missing.joined(separator: ", ")) section: truncated")
        }
        if seen.contains(5) != seen.contains(6) {
            throw FramingError("has resources without their offsets (sections 5 and 6): " +
                               "truncated")
        }
    }

    /// MLIR's prefix varint: the first byte's trailing zeros count the bytes that follow (a
    /// zero first byte: eight follow).
    static func varint(_ data: Data, _ at: inout Int, _ what: String) throws -> UInt64 {
        guard at < data.count else { throw FramingError("ends inside \(what)") }
        let first = data[data.startIndex + at]
        if first & 1 == 1 {
            at += 1
            return UInt64(first >> 1)
        }
        let extra = first == 0 ? 8 : first.trailingZeroBitCount
        guard at + 1 + extra <= data.count else { throw FramingError("ends inside \(what)") }
        var raw: UInt64 = 0
        let start = first == 0 ? 1 : 0, count = first == 0 ? 8 : extra + 1
        for k in 0..<count {
            raw |= UInt64(data[data.startIndex + at + start + k]) << (8 * UInt64(k))
        }
        at += 1 + extra
        return first == 0 ? raw : raw >> UInt64(extra + 1)
    }
}
