#if canImport(CoreML)
import CoreML
import EdgeCore
import Foundation

/// Tensor <-> MLMultiArray, for block inputs (float32 or int32, as the manifest says) and
/// outputs (float32 or float16, any strides: Neural Engine outputs may be padded).
enum MultiArray {
    static func make(_ tensor: Tensor, signature: Manifest.Signature) throws -> MLMultiArray {
        guard tensor.shape == signature.shape else {
            throw ManifestError.invalid("input \(signature.name): shape \(tensor.shape), " +
                                        "the block takes \(signature.shape)")
        }
        let int = signature.dtype == "int32"
        let array = try MLMultiArray(shape: tensor.shape.map { NSNumber(value: $0) },
                                     dataType: int ? .int32 : .float32)
        if int {
            array.withUnsafeMutableBufferPointer(ofType: Int32.self) { out, strides in
                copy(tensor.data.map { Int32($0) }, into: out, shape: tensor.shape,
                     strides: strides)
            }
        } else {
            array.withUnsafeMutableBufferPointer(ofType: Float.self) { out, strides in
                copy(tensor.data, into: out, shape: tensor.shape, strides: strides)
            }
        }
        return array
    }

    static func copy<T>(_ values: [T], into out: UnsafeMutableBufferPointer<T>, shape: [Int],
                        strides: [Int]) {
        for (i, value) in values.enumerated() {
            out[stridedOffset(of: i, shape: shape, strides: strides)] = value
        }
    }

    static func tensor(_ array: MLMultiArray) throws -> Tensor {
        let shape = array.shape.map(\.intValue), count = shape.reduce(1, *)
        var data = [Float](repeating: 0, count: count)
        switch array.dataType {
        case .float32:
            array.withUnsafeBufferPointer(ofType: Float.self) { buffer in
                let strides = array.strides.map(\.intValue)
                for i in 0..<count {
                    data[i] = buffer[stridedOffset(of: i, shape: shape, strides: strides)]
                }
            }
        case .float16:
            #if arch(arm64)
            array.withUnsafeBufferPointer(ofType: Float16.self) { buffer in
                let strides = array.strides.map(\.intValue)
                for i in 0..<count {
                    data[i] = Float(buffer[stridedOffset(of: i, shape: shape, strides: strides)])
                }
            }
            #else  // no Float16 type on Intel Macs: NSNumber access by index (slower)
            for i in 0..<count {
                var rest = i, index = [NSNumber](repeating: 0, count: shape.count)
                for axis in stride(from: shape.count - 1, through: 0, by: -1) {
                    index[axis] = NSNumber(value: rest % shape[axis]); rest /= shape[axis]
                }
                data[i] = array[index].floatValue
            }
            #endif
        default:
            throw ManifestError.invalid("block output of data type \(array.dataType.rawValue): " +
                                        "expected float32 or float16")
        }
        return Tensor(shape: shape, data: data)
    }
}
#endif
