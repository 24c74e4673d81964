import Foundation

/// What a seed means (edge/core/noise.py): the initial latents for `seed` are PyTorch's
/// `torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=float32)`,
/// what diffusers draws for that generator, so a seed gives the same video in every runtime.
///
/// - engine: the 32-bit Mersenne Twister seeded as `std::mt19937` with the seed's low 32 bits
///   (PyTorch's `manual_seed`);
/// - 16 values or more (PyTorch's `normal_fill`): one float32 uniform per value, the low 24
///   bits of one word times 2^-24; each group of 16 becomes 8 Box-Muller pairs in float32
///   (u1 = 1 - data[j], u2 = data[j + 8]; data[j] = r cos, data[j + 8] = r sin); when the
///   count is not a multiple of 16 the last 16 values are drawn again from 16 fresh words;
/// - fewer than 16 values: float64 normals, each pair from two 53-bit uniforms of two words
///   each (high word first), r = sqrt(-2 log1p(-u2)), theta = 2 pi u1, cos value first.
///
/// PyTorch computes the large path with AVX2 versions of Cephes' logf and sincosf
/// (avx_mathfun.h, as its normal_fill_16_AVX2); they are computed here the same way, 8 lanes
/// at a time, so values agree with torch's to a float32 rounding or two (the XCTests hold
/// them to tests/fixtures/noise/torch_randn.json within 1e-5).
public enum TorchNoise {
    /// The manifest's `noise` field for this definition.
    public static let definition = "torch.randn/cpu/float32"
    /// What a package without the field meant by a seed (NumPy PCG64 noise): not drawn here.
    public static let legacyDefinition = "numpy.pcg64"
    /// torch.Generator.manual_seed takes a signed 64-bit seed.
    public static let maxSeed = UInt64(Int64.max)

    // MARK: seeds

    private static func outOfRange(_ name: String, _ value: Any) -> NoiseError {
        NoiseError("\(name) \(value) is out of range: a seed is from 0 to 2^63 - 1")
    }

    /// The seed, or an error naming it: a whole number from 0 to 2^63 - 1.
    @discardableResult
    public static func checkSeed(_ seed: UInt64, name: String = "seed") throws -> UInt64 {
        guard seed <= maxSeed else {
            throw outOfRange(name, seed)
        }
        return seed
    }

    /// A seed held as a signed integer (the demo's form): a negative one is refused.
    public static func checkSeed(_ seed: Int, name: String = "seed") throws -> UInt64 {
        guard seed >= 0 else {
            throw outOfRange(name, seed)
        }
        return UInt64(seed)
    }

    /// A seed written in decimal (a command line's): digits only, 0 to 2^63 - 1; a negative
    /// or too large whole number is out of range, anything else (1.5, 1e3, +3) no seed.
    public static func seed(parsing text: String, name: String = "seed") throws -> UInt64 {
        func digits(_ s: Substring) -> Bool {
            !s.isEmpty && s.utf8.allSatisfy { (0x30...0x39).contains($0) }
        }
        if digits(text[...]) {
            guard let value = UInt64(text), value <= maxSeed else {
                throw outOfRange(name, text)
            }
            return value
        }
        if text.hasPrefix("-") && digits(text.dropFirst()) {
            throw outOfRange(name, text)
        }
        throw NoiseError("\(name) \(text) must be a whole number from 0 to 2^63 - 1")
    }

    /// Refuse to draw a seed for a package whose seeds meant other noise (written before the
    /// manifest's `noise` field, they meant NumPy PCG64 noise): the seed would give another
    /// video than the one the package's author saw. Given latents need no definition.
    /// `noise`: the manifest's field (nil: absent).
    public static func checkNoise(_ noise: String?, where place: String = "manifest.json") throws {
        let noise = noise ?? legacyDefinition
        if noise != definition {
            throw NoiseError("\(place): noise '\(noise)': this runtime draws a seed as " +
                             "'\(definition)', so the seed would give another video than the " +
                             "package's; re-export the package or pass the initial latents")
        }
    }

    // MARK: drawing

    /// `torch.randn(count)` for `seed`.
    public static func randn(count: Int, seed: UInt64) throws -> [Float] {
        try checkSeed(seed)
        precondition(count >= 0, "randn: count \(count)")
        return [Float](unsafeUninitializedCapacity: count) { buffer, initialized in
            fill(buffer, checkedSeed: seed)
            initialized = count
        }
    }

    /// `torch.randn(shape)` for `seed`.
    public static func randn(shape: [Int], seed: UInt64) throws -> Tensor {
        Tensor(shape: shape, data: try randn(count: shape.reduce(1, *), seed: seed))
    }

    /// Fill `out` with `torch.randn(out.count)` for `seed`.
    public static func fill(_ out: UnsafeMutableBufferPointer<Float>, seed: UInt64) throws {
        try checkSeed(seed)
        fill(out, checkedSeed: seed)
    }

    static func fill(_ out: UnsafeMutableBufferPointer<Float>, checkedSeed seed: UInt64) {
        var engine = MT19937(seed: UInt32(truncatingIfNeeded: seed))
        defer { engine.deallocate() }
        fill(out, &engine)
    }

    /// Consecutive `torch.randn(count)` of one generator seeded with `seed`, one per count:
    /// what a pipeline draws when it takes more noise from its generator after the initial
    /// latents (LTX-Video's decode noise is the second draw). Each draw reads the words the
    /// one before left; a draw under 16 values before another is refused, since PyTorch
    /// keeps half of its last pair for the next draw, which is not mirrored here
    /// (edge/core/noise.py torch_randn_draws).
    public static func randnDraws(counts: [Int], seed: UInt64) throws -> [[Float]] {
        try checkSeed(seed)
        if counts.dropLast().contains(where: { $0 < 16 }) {
            throw NoiseError("noise draws \(counts): only the last may hold under 16 values")
        }
        var engine = MT19937(seed: UInt32(truncatingIfNeeded: seed))
        defer { engine.deallocate() }
        return counts.map { count in
            precondition(count >= 0, "randnDraws: count \(count)")
            return [Float](unsafeUninitializedCapacity: count) { buffer, initialized in
                fill(buffer, &engine)
                initialized = count
            }
        }
    }

    /// `torch.randn(out.count)` from `engine` as it stands (its next words).
    static func fill(_ out: UnsafeMutableBufferPointer<Float>, _ engine: inout MT19937) {
        guard let base = out.baseAddress, out.count > 0 else { return }
        let n = out.count
        if n < 16 {
            fewNormals(base, n, &engine)
            return
        }
        // uniforms for every value, then the Box-Muller groups, a chunk at a time (in cache)
        let chunk = 16 * 1024
        var start = 0
        while start < n {
            let end = min(n, start + chunk)
            engine.uniforms(base + start, end - start)
            let groupsEnd = min(end, n - n % 16)
            if groupsEnd > start { boxMuller16(base + start, (groupsEnd - start) / 16) }
            start = end
        }
        if n % 16 != 0 {  // PyTorch redraws the last 16 values from 16 fresh words
            engine.uniforms(base + n - 16, 16)
            boxMuller16(base + n - 16, 1)
        }
    }

    /// PyTorch's path under 16 values: at::normal_distribution<double>, one pair per two
    /// values (the sine half kept by the generator for the next value).
    static func fewNormals(_ out: UnsafeMutablePointer<Float>, _ n: Int, _ engine: inout MT19937) {
        func uniform53() -> Double {
            let high = UInt64(engine.next()), low = UInt64(engine.next())
            return Double(((high << 32) | low) & ((1 << 53) - 1)) * 0x1p-53
        }
        var i = 0
        while i < n {
            let u1 = uniform53(), u2 = uniform53()
            let radius = (-2.0 * log1p(-u2)).squareRoot()
            let theta = 2.0 * Double.pi * u1
            out[i] = Float(radius * cos(theta))
            if i + 1 < n { out[i + 1] = Float(radius * sin(theta)) }
            i += 2
        }
    }

    /// `groups` groups of 16 uniforms at `data` -> normals in place (normal_fill_16_AVX2).
    @inline(__always)
    static func boxMuller16(_ data: UnsafeMutablePointer<Float>, _ groups: Int) {
        let raw = UnsafeMutableRawPointer(data)
        let one = SIMD8<Float>(repeating: 1), minusTwo = SIMD8<Float>(repeating: -2)
        let twoPi = SIMD8<Float>(repeating: Float(2.0 * Double.pi))
        for g in 0..<groups {
            let offset = g * 64
            let u1 = one - raw.loadUnaligned(fromByteOffset: offset, as: SIMD8<Float>.self)
            let u2 = raw.loadUnaligned(fromByteOffset: offset + 32, as: SIMD8<Float>.self)
            let radius = magnitude(minusTwo * logPositive(u1)).squareRoot()
            let (s, c) = sinCosNonNegative(twoPi * u2)
            raw.storeBytes(of: radius * c, toByteOffset: offset, as: SIMD8<Float>.self)
            raw.storeBytes(of: radius * s, toByteOffset: offset + 32, as: SIMD8<Float>.self)
        }
    }

    /// |v| (v is -2 log u1 >= 0 here): a square root of what the compiler sees is not
    /// negative compiles to one vector instruction, not a call per lane.
    @inline(__always)
    static func magnitude(_ v: SIMD8<Float>) -> SIMD8<Float> {
        unsafeBitCast(unsafeBitCast(v, to: SIMD8<UInt32>.self) & 0x7FFF_FFFF, to: SIMD8<Float>.self)
    }

    /// Cephes' logf as avx_mathfun's log256_ps, for positive normal x (u1 is in [2^-24, 1]).
    @inline(__always)
    static func logPositive(_ v: SIMD8<Float>) -> SIMD8<Float> {
        let bits = unsafeBitCast(v, to: SIMD8<UInt32>.self)
        let exponent = SIMD8<Int32>(truncatingIfNeeded: bits &>> 23) &- 0x7f
        var e = SIMD8<Float>(exponent) + 1
        // the mantissa in [0.5, 1)
        var x = unsafeBitCast((bits & 0x807F_FFFF) | 0x3F00_0000, to: SIMD8<Float>.self)
        let small = x .< 0.707106781186547524   // SQRTHF
        let tmp = SIMD8<Float>(repeating: 0).replacing(with: x, where: small)
        x -= 1
        e -= SIMD8<Float>(repeating: 0).replacing(with: 1, where: small)
        x += tmp
        let z = x * x
        var y = SIMD8<Float>(repeating: 7.0376836292E-2)
        y = y * x + -1.1514610310E-1
        y = y * x + 1.1676998740E-1
        y = y * x + -1.2420140846E-1
        y = y * x + 1.4249322787E-1
        y = y * x + -1.6668057665E-1
        y = y * x + 2.0000714765E-1
        y = y * x + -2.4999993993E-1
        y = y * x + 3.3333331174E-1
        y = y * x
        y = y * z
        y += e * -2.12194440e-4
        y -= z * 0.5
        x += y
        x += e * 0.693359375
        return x
    }

    /// Cephes' sinf and cosf as avx_mathfun's sincos256_ps, for x >= 0 (theta = 2 pi u2).
    @inline(__always)
    static func sinCosNonNegative(_ v: SIMD8<Float>) -> (sin: SIMD8<Float>, cos: SIMD8<Float>) {
        var x = v
        // j = (int)(x * 4/pi), rounded up to even; y = j as a float
        var j = SIMD8<Int32>(
            truncatingIfNeeded: unsafeBitCast(x * 1.27323954473516 + 0x1p23, to: SIMD8<UInt32>.self)
                & 0x7F_FFFF)
        // the +2^23 above rounds to nearest; truncate instead where it rounded up
        let y0 = SIMD8<Float>(j)
        j = j &- SIMD8<Int32>(repeating: 0).replacing(with: 1, where: y0 .> x * 1.27323954473516)
        j = (j &+ 1) & ~1
        let y = SIMD8<Float>(j)
        let swapSignSin = (j & 4) &<< 29
        // all ones where j & 2 == 0 (there sin is the sine polynomial), made with integer
        // arithmetic: an integer SIMD comparison compiles to a loop over the lanes
        let polyMask = SIMD8<UInt32>(truncatingIfNeeded: ((j & 2) &>> 1) &- 1)
        x = x + y * -0.78515625
        x = x + y * -2.4187564849853515625e-4
        x = x + y * -3.77489497744594108e-8
        let signCos = (~(j &- 2) & 4) &<< 29
        let z = x * x
        var c = SIMD8<Float>(repeating: 2.443315711809948E-005)
        c = c * z + -1.388731625493765E-003
        c = c * z + 4.166664568298827E-002
        c = c * z
        c = c * z
        c -= z * 0.5
        c += 1
        var s = SIMD8<Float>(repeating: -1.9515295891E-4)
        s = s * z + 8.3321608736E-3
        s = s * z + -1.6666654611E-1
        s = s * z
        s = s * x
        s += x
        let sBits = unsafeBitCast(s, to: SIMD8<UInt32>.self),
            cBits = unsafeBitCast(c, to: SIMD8<UInt32>.self)
        let sinBits = ((sBits & polyMask) | (cBits & ~polyMask))
            ^ SIMD8<UInt32>(truncatingIfNeeded: swapSignSin)
        let cosBits = ((cBits & polyMask) | (sBits & ~polyMask))
            ^ SIMD8<UInt32>(truncatingIfNeeded: signCos)
        return (unsafeBitCast(sinBits, to: SIMD8<Float>.self),
                unsafeBitCast(cosBits, to: SIMD8<Float>.self))
    }
}

/// A seed or noise definition refused; the message names the value.
public struct NoiseError: Error, CustomStringConvertible, Equatable {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// The 32-bit Mersenne Twister (std::mt19937, PyTorch's at::mt19937): 624 words of state,
/// regenerated all at once, each word tempered as it is handed out.
struct MT19937 {
    private static let n = 624, m = 397
    private let state: UnsafeMutablePointer<UInt32>
    private var index: Int

    init(seed: UInt32) {
        state = .allocate(capacity: Self.n)
        state[0] = seed
        for i in 1..<Self.n {
            let previous = state[i - 1]
            state[i] = 1_812_433_253 &* (previous ^ (previous >> 30)) &+ UInt32(i)
        }
        index = Self.n
    }

    func deallocate() { state.deallocate() }

    @inline(__always)
    private static func twisted(_ upper: UInt32, _ lower: UInt32, _ far: UInt32) -> UInt32 {
        let y = (upper & 0x8000_0000) | (lower & 0x7FFF_FFFF)
        return far ^ (y >> 1) ^ ((0 &- (y & 1)) & 0x9908_B0DF)
    }

    private mutating func twist() {
        let s = state, n = Self.n, m = Self.m
        for i in 0..<(n - m) { s[i] = Self.twisted(s[i], s[i + 1], s[i + m]) }
        for i in (n - m)..<(n - 1) { s[i] = Self.twisted(s[i], s[i + 1], s[i + m - n]) }
        s[n - 1] = Self.twisted(s[n - 1], s[0], s[m - 1])
        index = 0
    }

    @inline(__always)
    private static func temper(_ word: UInt32) -> UInt32 {
        var y = word
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C_5680
        y ^= (y << 15) & 0xEFC6_0000
        y ^= y >> 18
        return y
    }

    mutating func next() -> UInt32 {
        if index == Self.n { twist() }
        defer { index += 1 }
        return Self.temper(state[index])
    }

    /// `count` float32 uniforms in [0, 1): the low 24 bits of a word times 2^-24.
    mutating func uniforms(_ out: UnsafeMutablePointer<Float>, _ count: Int) {
        var done = 0
        while done < count {
            if index == Self.n { twist() }
            let run = min(count - done, Self.n - index)
            let from = state + index, to = out + done
            for k in 0..<run {
                to[k] = Float(Self.temper(from[k]) & 0xFF_FFFF) * 0x1p-24
            }
            index += run
            done += run
        }
    }
}
