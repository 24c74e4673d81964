import Foundation

/// SHA-256 (FIPS 180-4), written by hand, for verifying package files against the sha256s in
/// the manifest.
///
/// Why by hand: Foundation on Linux has no SHA-256, and this package may depend on no outside
/// Swift package (swift-crypto included). On Apple platforms the runtime may use CryptoKit
/// instead; this is what it uses on Linux and wherever CryptoKit is absent.
///
/// It is kept fast even in debug builds (which is how `swift test` runs): 64-byte blocks are
/// read straight from the caller's memory through unsafe pointers, the message schedule lives
/// in one fixed 64-word scratch buffer per `update` call (no Array per block), and all
/// arithmetic is wrapping (`&+`) with masking shifts, which stay inlined at -Onone.
///
/// Usage: `var h = StreamingSHA256(); h.update(chunk) ...; let digest = h.finalize()`.
/// A partial block is buffered between `update` calls, so chunks may be any size.
/// `finalize()` spends the hasher: calling `update` or `finalize` on it again is a
/// programming error (precondition failure).
public struct StreamingSHA256 {
    /// H0...H7 (FIPS 180-4 §5.3.3), then the running hash value.
    private var state: (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32) = (
        0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a,
        0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19
    )
    /// The partial block carried between `update` calls (64 bytes) and how much of it is filled.
    private var buffer: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) =
        (0, 0, 0, 0, 0, 0, 0, 0)
    private var buffered = 0
    /// Message length in bytes so far (the padding records it in bits, modulo 2^64).
    private var length: UInt64 = 0
    private var finalized = false

    public init() {}

    /// Hash `bytes` (any length, including zero) after everything given before.
    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        precondition(!finalized, "StreamingSHA256: update after finalize")
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        length &+= UInt64(bytes.count)
        absorb(base, bytes.count)
    }

    /// Convenience: hash the bytes of `data`.
    public mutating func update(_ data: Data) {
        data.withUnsafeBytes { update($0) }
    }

    /// Pad, process the last block(s) and return the 32-byte digest. The hasher is spent
    /// afterwards.
    public mutating func finalize() -> [UInt8] {
        precondition(!finalized, "StreamingSHA256: finalize called twice")
        // 0x80, zeros up to 56 mod 64, then the length in bits as a big-endian UInt64.
        let bitLength = length &* 8
        let padCount = buffered < 56 ? 56 - buffered : 120 - buffered
        withUnsafeTemporaryAllocation(byteCount: 128, alignment: 8) { pad in
            let p = pad.baseAddress!
            p.initializeMemory(as: UInt8.self, repeating: 0, count: 128)
            p.storeBytes(of: UInt8(0x80), as: UInt8.self)
            p.storeBytes(of: bitLength.bigEndian, toByteOffset: padCount, as: UInt64.self)
            absorb(UnsafeRawPointer(p), padCount + 8)
        }
        precondition(buffered == 0)
        finalized = true
        let s = state
        var out = [UInt8](repeating: 0, count: 32)
        out.withUnsafeMutableBytes { o in
            for (i, word) in [s.0, s.1, s.2, s.3, s.4, s.5, s.6, s.7].enumerated() {
                o.storeBytes(of: word.bigEndian, toByteOffset: 4 * i, as: UInt32.self)
            }
        }
        return out
    }

    /// One-shot: the lowercase hex SHA-256 of `data`.
    public static func hex(_ data: Data) -> String {
        var h = StreamingSHA256()
        h.update(data)
        return hexString(h.finalize())
    }

    // MARK: - Blocks

    /// Feed `count` bytes at `input` through the block buffer and the compression function.
    private mutating func absorb(_ input: UnsafeRawPointer, _ count: Int) {
        var st = state
        var buf = buffer
        var filled = buffered
        SHA256Constants.k.withUnsafeBufferPointer { kb in
            let k = kb.baseAddress!
            withUnsafeTemporaryAllocation(of: UInt32.self, capacity: 64) { wb in
                let w = wb.baseAddress!
                withUnsafeMutableBytes(of: &st) { sb in
                    let h = sb.baseAddress!.assumingMemoryBound(to: UInt32.self)
                    withUnsafeMutableBytes(of: &buf) { bb in
                        let block = bb.baseAddress!
                        var p = input
                        var n = count
                        // Top up a partial block first.
                        if filled > 0 {
                            let take = min(64 - filled, n)
                            (block + filled).copyMemory(from: p, byteCount: take)
                            filled += take
                            p += take
                            n -= take
                            if filled < 64 { return }
                            StreamingSHA256.compress(h, UnsafeRawPointer(block), w, k)
                            filled = 0
                        }
                        // Whole blocks straight from the input.
                        while n >= 64 {
                            StreamingSHA256.compress(h, p, w, k)
                            p += 64
                            n -= 64
                        }
                        // Keep the tail.
                        if n > 0 {
                            block.copyMemory(from: p, byteCount: n)
                            filled = n
                        }
                    }
                }
            }
        }
        state = st
        buffer = buf
        buffered = filled
    }

    /// The SHA-256 compression function (FIPS 180-4 §6.2.2) on one 64-byte block at `block`
    /// (any alignment), updating the eight hash words at `h`; `w` is 64 words of scratch.
    private static func compress(
        _ h: UnsafeMutablePointer<UInt32>, _ block: UnsafeRawPointer,
        _ w: UnsafeMutablePointer<UInt32>, _ k: UnsafePointer<UInt32>
    ) {
        // Message schedule.
        var t = 0
        while t < 16 {
            w[t] = UInt32(bigEndian: block.loadUnaligned(fromByteOffset: 4 &* t, as: UInt32.self))
            t &+= 1
        }
        while t < 64 {
            let x = w[t &- 15], y = w[t &- 2]
            let s0 = ((x &>> 7) | (x &<< 25)) ^ ((x &>> 18) | (x &<< 14)) ^ (x &>> 3)
            let s1 = ((y &>> 17) | (y &<< 15)) ^ ((y &>> 19) | (y &<< 13)) ^ (y &>> 10)
            w[t] = w[t &- 16] &+ s0 &+ w[t &- 7] &+ s1
            t &+= 1
        }
        // Rounds.
        var a = h[0], b = h[1], c = h[2], d = h[3]
        var e = h[4], f = h[5], g = h[6], hh = h[7]
        t = 0
        while t < 64 {
            let S1 = ((e &>> 6) | (e &<< 26)) ^ ((e &>> 11) | (e &<< 21)) ^ ((e &>> 25) | (e &<< 7))
            let ch = g ^ (e & (f ^ g))  // (e & f) ^ (~e & g)
            let t1 = hh &+ S1 &+ ch &+ k[t] &+ w[t]
            let S0 = ((a &>> 2) | (a &<< 30)) ^ ((a &>> 13) | (a &<< 19))
                ^ ((a &>> 22) | (a &<< 10))
            let maj = (a & b) | (c & (a | b))  // (a & b) ^ (a & c) ^ (b & c)
            let t2 = S0 &+ maj
            hh = g
            g = f
            f = e
            e = d &+ t1
            d = c
            c = b
            b = a
            a = t1 &+ t2
            t &+= 1
        }
        h[0] &+= a
        h[1] &+= b
        h[2] &+= c
        h[3] &+= d
        h[4] &+= e
        h[5] &+= f
        h[6] &+= g
        h[7] &+= hh
    }
}

/// The lowercase hex of `bytes` (two characters a byte).
public func hexString(_ bytes: [UInt8]) -> String {
    let digits: [UInt8] = Array("0123456789abcdef".utf8)
    var out = [UInt8]()
    out.reserveCapacity(bytes.count * 2)
    for byte in bytes {
        out.append(digits[Int(byte >> 4)])
        out.append(digits[Int(byte & 0x0f)])
    }
    return String(decoding: out, as: UTF8.self)
}

/// The round constants K0...K63 (FIPS 180-4 §4.2.2).
private enum SHA256Constants {
    static let k: [UInt32] = [
        0x428a_2f98, 0x7137_4491, 0xb5c0_fbcf, 0xe9b5_dba5,
        0x3956_c25b, 0x59f1_11f1, 0x923f_82a4, 0xab1c_5ed5,
        0xd807_aa98, 0x1283_5b01, 0x2431_85be, 0x550c_7dc3,
        0x72be_5d74, 0x80de_b1fe, 0x9bdc_06a7, 0xc19b_f174,
        0xe49b_69c1, 0xefbe_4786, 0x0fc1_9dc6, 0x240c_a1cc,
        0x2de9_2c6f, 0x4a74_84aa, 0x5cb0_a9dc, 0x76f9_88da,
        0x983e_5152, 0xa831_c66d, 0xb003_27c8, 0xbf59_7fc7,
        0xc6e0_0bf3, 0xd5a7_9147, 0x06ca_6351, 0x1429_2967,
        0x27b7_0a85, 0x2e1b_2138, 0x4d2c_6dfc, 0x5338_0d13,
        0x650a_7354, 0x766a_0abb, 0x81c2_c92e, 0x9272_2c85,
        0xa2bf_e8a1, 0xa81a_664b, 0xc24b_8b70, 0xc76c_51a3,
        0xd192_e819, 0xd699_0624, 0xf40e_3585, 0x106a_a070,
        0x19a4_c116, 0x1e37_6c08, 0x2748_774c, 0x34b0_bcb5,
        0x391c_0cb3, 0x4ed8_aa4a, 0x5b9c_ca4f, 0x682e_6ff3,
        0x748f_82ee, 0x78a5_636f, 0x84c8_7814, 0x8cc7_0208,
        0x90be_fffa, 0xa450_6ceb, 0xbef9_a3f7, 0xc671_78f2,
    ]
}
