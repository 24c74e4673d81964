import Foundation

/// The values a `shape` holds, each `width` bytes, when that many bytes can be: every
/// dimension non-negative and the product (in bytes) within `limit`, reached without
/// overflowing. Shapes read from files (bundles, .npy, manifests) go through this before any
/// allocation: `[2^40, 2^40, 2^40]` is refused, not a crash.
public func checkedCount(_ shape: [Int], width: Int = 1, limit: Int = Int.max) -> Int? {
    var count = 1
    for dimension in shape {
        guard dimension >= 0 else { return nil }
        let (product, overflow) = count.multipliedReportingOverflow(by: dimension)
        guard !overflow else { return nil }
        count = product
    }
    let (bytes, overflow) = count.multipliedReportingOverflow(by: width)
    return overflow || bytes > limit ? nil : count
}

/// Where the `index`-th value in row-major order sits in a strided buffer (a framework's
/// output may be padded: Core ML's Neural Engine arrays, Core AI's views).
public func stridedOffset(of index: Int, shape: [Int], strides: [Int]) -> Int {
    var rest = index, at = 0
    for axis in stride(from: shape.count - 1, through: 0, by: -1) {
        at += (rest % shape[axis]) * strides[axis]
        rest /= shape[axis]
    }
    return at
}

/// A dense float32 array in row-major order: what blocks exchange and the sampler steps.
public struct Tensor: Equatable {
    public var shape: [Int]
    public var data: [Float]

    public init(shape: [Int], data: [Float]) {
        precondition(shape.reduce(1, *) == data.count,
                     "shape \(shape) holds \(shape.reduce(1, *)) values, got \(data.count)")
        self.shape = shape
        self.data = data
    }

    public init(zeros shape: [Int]) {
        self.init(shape: shape, data: [Float](repeating: 0, count: shape.reduce(1, *)))
    }

    public var count: Int { data.count }

    /// Sample `i` of the leading (batch) axis.
    public func item(_ i: Int) -> Tensor {
        let n = count / shape[0]
        return Tensor(shape: [1] + shape.dropFirst(), data: Array(data[(i * n)..<((i + 1) * n)]))
    }

    /// Concatenation along the leading (batch) axis.
    public static func concat(_ parts: [Tensor]) -> Tensor {
        let rest = Array(parts[0].shape.dropFirst())
        precondition(parts.allSatisfy { Array($0.shape.dropFirst()) == rest },
                     "concat: shapes differ")
        return Tensor(shape: [parts.reduce(0) { $0 + $1.shape[0] }] + rest,
                      data: parts.flatMap { $0.data })
    }

    public func reshaped(_ shape: [Int]) -> Tensor { Tensor(shape: shape, data: data) }

    /// Elements `range` of axis `axis` (NumPy's `np.take(x, range, axis)`).
    public func slice(axis: Int, _ range: Range<Int>) -> Tensor {
        let outer = shape[..<axis].reduce(1, *), inner = shape[(axis + 1)...].reduce(1, *)
        let length = shape[axis]
        var out = [Float]()
        out.reserveCapacity(outer * range.count * inner)
        for o in 0..<outer {
            let start = (o * length + range.lowerBound) * inner
            out.append(contentsOf: data[start..<(start + range.count * inner)])
        }
        var newShape = shape
        newShape[axis] = range.count
        return Tensor(shape: newShape, data: out)
    }

    /// Concatenation along `axis` (NumPy's `np.concatenate(parts, axis)`).
    public static func concat(_ parts: [Tensor], axis: Int) -> Tensor {
        if axis == 0 { return concat(parts) }
        let first = parts[0].shape
        precondition(parts.allSatisfy { $0.shape.count == first.count
            && zip($0.shape, first).enumerated().allSatisfy {
                $0.offset == axis || $0.element.0 == $0.element.1
            } },
            "concat along \(axis): shapes differ")
        let outer = first[..<axis].reduce(1, *), inner = first[(axis + 1)...].reduce(1, *)
        var out = [Float]()
        out.reserveCapacity(parts.reduce(0) { $0 + $1.count })
        for o in 0..<outer {
            for part in parts {
                let run = part.shape[axis] * inner
                out.append(contentsOf: part.data[(o * run)..<((o + 1) * run)])
            }
        }
        var newShape = first
        newShape[axis] = parts.reduce(0) { $0 + $1.shape[axis] }
        return Tensor(shape: newShape, data: out)
    }
}
