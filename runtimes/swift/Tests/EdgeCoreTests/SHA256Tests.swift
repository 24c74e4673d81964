import Foundation
import XCTest
import EdgeCore

/// The hand-written SHA-256 against FIPS 180-4 / NIST test vectors, against itself fed in
/// odd-sized chunks, and against the system `sha256sum`.
final class SHA256Tests: XCTestCase {
    private func digest(_ bytes: [UInt8]) -> String {
        var h = StreamingSHA256()
        bytes.withUnsafeBytes { h.update($0) }
        return hexString(h.finalize())
    }

    /// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
    private func pseudoRandom(_ count: Int, seed: UInt64 = 0x9E37_79B9_7F4A_7C15) -> [UInt8] {
        var x = seed
        var out = [UInt8](repeating: 0, count: count)
        out.withUnsafeMutableBufferPointer { p in
            var i = 0
            while i < count {
                x ^= x >> 12; x ^= x << 25; x ^= x >> 27
                var r = x &* 0x2545_F491_4F6C_DD1D
                var j = 0
                while j < 8 && i < count {
                    p[i] = UInt8(truncatingIfNeeded: r)
                    r >>= 8; i += 1; j += 1
                }
            }
        }
        return out
    }

    func testKnownDigests() {
        XCTAssertEqual(StreamingSHA256.hex(Data()),
                       "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        XCTAssertEqual(StreamingSHA256.hex(Data("abc".utf8)),
                       "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        XCTAssertEqual(StreamingSHA256.hex(
                           Data("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)),
                       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        XCTAssertEqual(StreamingSHA256.hex(
                           Data(("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                                 + "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu")
                                .utf8)),
                       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1")
        XCTAssertEqual(StreamingSHA256.hex(Data(repeating: UInt8(ascii: "a"), count: 1_000_000)),
                       "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    func testHexString() {
        XCTAssertEqual(hexString([]), "")
        XCTAssertEqual(hexString([0x00, 0x0f, 0x10, 0xab, 0xff]), "000f10abff")
        var h = StreamingSHA256()
        XCTAssertEqual(h.finalize().count, 32)
    }

    /// Every message length 0..<200 (all the padding cases around 55/56/63/64 bytes and two
    /// blocks): the sha256 of the concatenated hex digests, computed with Python's hashlib.
    func testPaddingBoundaries() {
        var all = ""
        for n in 0..<200 {
            all += digest((0..<n).map { UInt8(truncatingIfNeeded: n * 7 + $0) })
        }
        XCTAssertEqual(StreamingSHA256.hex(Data(all.utf8)),
                       "7181420a0883a0249332ee17b9c465d890697a623979718cb877808aa8b0ffd1")
    }

    func testIrregularChunksMatchOneShot() {
        let bytes = pseudoRandom(100_000)
        let oneShot = StreamingSHA256.hex(Data(bytes))
        let patterns: [[Int]] = [
            [1], [63], [64], [65], [1000], [1, 63, 64, 65, 1000, 0, 2, 127, 128, 129, 4096, 7],
            [55, 56, 57, 3], [100_000],
        ]
        for pattern in patterns {
            var h = StreamingSHA256()
            var offset = 0, i = 0
            bytes.withUnsafeBytes { all in
                while offset < all.count {
                    let n = min(pattern[i % pattern.count], all.count - offset)
                    h.update(UnsafeRawBufferPointer(rebasing: all[offset..<offset + n]))
                    offset += n; i += 1
                }
            }
            XCTAssertEqual(hexString(h.finalize()), oneShot, "chunk pattern \(pattern)")
        }
        // The Data convenience, in pieces.
        var h = StreamingSHA256()
        for start in stride(from: 0, to: bytes.count, by: 777) {
            h.update(Data(bytes[start..<min(start + 777, bytes.count)]))
        }
        XCTAssertEqual(hexString(h.finalize()), oneShot)
    }

    func testMatchesSystemSha256sum() throws {
        let tool = "/usr/bin/sha256sum"
        guard FileManager.default.isExecutableFile(atPath: tool) else {
            throw XCTSkip("\(tool) is missing, so there is nothing to compare with")
        }
        let dir = FileManager.default.temporaryDirectory
            .appendingPathComponent("sha256-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("random.bin")
        let data = Data(pseudoRandom(3 * 1024 * 1024 + 17, seed: 42))
        try data.write(to: file)

        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = [file.path]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let output = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        XCTAssertEqual(process.terminationStatus, 0)
        let expected = try XCTUnwrap(String(decoding: output, as: UTF8.self)
            .split(separator: " ").first.map(String.init))
        XCTAssertEqual(expected.count, 64)
        XCTAssertEqual(StreamingSHA256.hex(data), expected)
        XCTAssertEqual(StreamingSHA256.hex(try Data(contentsOf: file)), expected)
    }

    /// Not an assertion: prints the hashing speed of this build (debug under `swift test`).
    func testThroughput() {
        let data = Data(pseudoRandom(16 * 1024 * 1024, seed: 7))
        var h = StreamingSHA256()
        let clock = ContinuousClock()
        let elapsed = clock.measure {
            // 1 MiB chunks, as a file reader would feed it.
            for start in stride(from: 0, to: data.count, by: 1 << 20) {
                data[start..<start + (1 << 20)].withUnsafeBytes { h.update($0) }
            }
        }
        XCTAssertEqual(h.finalize().count, 32)
        let seconds = Double(elapsed.components.seconds)
            + Double(elapsed.components.attoseconds) / 1e18
        let mbps = Double(data.count) / 1_048_576 / seconds
        print(String(format: "StreamingSHA256 throughput: %.1f MiB/s (16 MiB in %.3f s)", mbps,
                     seconds))
    }
}
