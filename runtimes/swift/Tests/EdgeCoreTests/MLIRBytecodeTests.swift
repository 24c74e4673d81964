import Foundation
import XCTest
@testable import EdgeCore

/// MLIRBytecode on bytecode built here by MLIR's encoding rules, as tests/test_mlir_bytecode.py
/// builds it: whole files pass, every cut and every broken frame is named. (BundleTests runs it
/// on a real Core AI program.)
final class MLIRBytecodeTests: XCTestCase {
    /// MLIR's prefix varint: n more bytes are announced by n trailing zero bits.
    func varint(_ value: UInt64) -> [UInt8] {
        for extra in 0..<8 where value < UInt64(1) << UInt64(7 * (extra + 1)) {
            let raw = (value << UInt64(extra + 1)) | (UInt64(1) << UInt64(extra))
            return (0...extra).map { UInt8(truncatingIfNeeded: raw >> UInt64(8 * $0)) }
        }
        return [0] + (0..<8).map { UInt8(truncatingIfNeeded: value >> UInt64(8 * $0)) }
    }

    func section(_ id: Int, _ data: [UInt8], at: Int, alignment: Int = 0) -> [UInt8] {
        guard alignment > 0 else { return [UInt8(id)] + varint(UInt64(data.count)) + data }
        let head = [UInt8(id | 0x80)] + varint(UInt64(data.count)) + varint(UInt64(alignment))
        let pad = (alignment - (at + head.count) % alignment) % alignment
        return head + [UInt8](repeating: 0xCB, count: pad) + data
    }

    /// Lengths that take one, two and three varint bytes; a 64-byte aligned resource section.
    func bytecode(version: UInt64 = 6, skip: Set<Int> = [], twice: Int? = nil) -> [UInt8] {
        var out = MLIRBytecode.magic + varint(version) + Array("MLIR22.0.0git".utf8) + [0]
        for (id, size, align) in [(1, 44, 0), (3, 300, 0), (2, 20000, 0), (4, 5, 0), (6, 9, 0),
                                  (5, 700, 64), (0, 130, 0), (8, 3, 0)] where !skip.contains(id) {
            out += section(id, (0..<size).map { UInt8($0 % 256) }, at: out.count, alignment: align)
            if id == twice { out += section(id, [120], at: out.count) }
        }
        return out
    }

    func refusal(_ bytes: [UInt8]) -> String? {
        do {
            try MLIRBytecode.checkFraming(Data(bytes))
            return nil
        } catch {
            return "\(error)"
        }
    }

    func testVarintsOfEveryWidthDecodeAsMLIRWritesThem() throws {
        for value: UInt64 in [5, 300, 20000, 1 << 40, 1 << 62] {
            let data = Data(MLIRBytecode.magic + varint(value) + [112, 0])
            XCTAssertEqual(try MLIRBytecode.sections(of: data).version, value)
        }
    }

    func testAWholeFilePassesAndListsItsSections() throws {
        let data = bytecode()
        let (version, found) = try MLIRBytecode.sections(of: Data(data))
        XCTAssertEqual(version, 6)
        XCTAssertEqual(found.map(\.id), [1, 3, 2, 4, 6, 5, 0, 8])
        XCTAssertEqual(found.last?.end, data.count)
        XCTAssertNil(refusal(data))
    }

    func testEveryCutIsRefused() {
        let data = bytecode()
        for cut in 0..<data.count where refusal(Array(data[..<cut])) == nil {
            XCTFail("a cut at \(cut) of \(data.count) bytes passed")
        }
    }

    func testABrokenFrameIsNamed() {
        let cases: [([UInt8], String)] = [
            (Array("MLIR".utf8) + bytecode().dropFirst(4), "magic number"),
            (bytecode(skip: [4]), "has no IR (4) section"),
            (bytecode(skip: [8]), "has no properties (8) section"),
            (bytecode(skip: [6]), "resources without their offsets"),
            (bytecode(twice: 3), "twice"),
            (MLIRBytecode.magic + varint(6) + [UInt8](repeating: 112, count: 300),
             "has no producer string"),
            (MLIRBytecode.magic + varint(6) + [112, 0, 5 | 0x80] + varint(1) + varint(1 << 40)
             + [120], "an alignment of 1099511627776"),
        ]
        for (bytes, message) in cases {
            let why = refusal(bytes) ?? "passed"
            XCTAssertTrue(why.contains(message), "\(message): \(why)")
        }
        XCTAssertNil(refusal(bytecode(version: 4, skip: [8])))  // properties only from 5
        var data = bytecode()
        let at = try? MLIRBytecode.sections(of: Data(data)).sections.first { $0.id == 5 }!.header
        let firstPad = at! + 1 + varint(700).count + varint(64).count
        XCTAssertEqual(data[firstPad], 0xCB)
        data[firstPad] = 0
        XCTAssertTrue((refusal(data) ?? "passed").contains("pads section 5"))
    }
}
