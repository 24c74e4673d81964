import EdgeCore
import Foundation

/// NumPy's .npy format (version 1.0), the little that edge-sample reads and writes: float32
/// latents in, uint8 frames out. Written by hand: Foundation has no reader, and no Swift
/// package can be fetched where this builds.
public enum NumPyFile {
    /// uint8 frames (T, H, W, 3), as the Python runtime's `video[0]`.
    public static func write(frames: [[UInt8]], height: Int, width: Int, to url: URL) throws {
        var header = "{'descr': '|u1', 'fortran_order': False, 'shape': " +
                     "(\(frames.count), \(height), \(width), 3), }"
        // magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64,
        // ending "\n"
        let unpadded = 10 + header.utf8.count + 1
        header += String(repeating: " ", count: (64 - unpadded % 64) % 64) + "\n"
        var data = Data([0x93] + Array("NUMPY".utf8) + [1, 0])
        let length = UInt16(header.utf8.count)
        data.append(contentsOf: [UInt8(length & 0xff), UInt8(length >> 8)])
        data.append(contentsOf: Array(header.utf8))
        for frame in frames { data.append(contentsOf: frame) }
        try data.write(to: url, options: .atomic)
    }

    /// A float32 (or float64, converted) C-order array.
    public static func readFloats(_ url: URL) throws -> Tensor {
        func bad(_ why: String) -> RuntimeError { .package("\(url.path): \(why)") }
        guard let data = FileManager.default.contents(atPath: url.path) else {
            throw bad("cannot be read")
        }
        let bytes = [UInt8](data)
        guard bytes.count > 10, bytes[0] == 0x93, Array(bytes[1..<6]) == Array("NUMPY".utf8) else {
            throw bad("not a NumPy .npy file")
        }
        let (major, headerStart) = (bytes[6], bytes[6] == 1 ? 10 : 12)
        guard major == 1 || major == 2 || major == 3, bytes.count >= headerStart else {
            throw bad("unknown .npy version \(bytes[6])")
        }
        let length = major == 1 ? Int(bytes[8]) | Int(bytes[9]) << 8
            : Int(bytes[8]) | Int(bytes[9]) << 8 | Int(bytes[10]) << 16 | Int(bytes[11]) << 24
        guard bytes.count >= headerStart + length,
              let header = String(bytes: bytes[headerStart..<(headerStart + length)],
                                  encoding: .utf8) else {
            throw bad("truncated header")
        }
        let descr: String
        if header.contains("'<f4'") {
            descr = "<f4"
        } else if header.contains("'<f8'") {
            descr = "<f8"
        } else {
            throw bad("not float32 or float64 little-endian " +
                      "(\(header.trimmingCharacters(in: .whitespacesAndNewlines)))")
        }
        guard header.contains("'fortran_order': False") else {
            throw bad("Fortran-ordered arrays are not read")
        }
        guard let open = header.range(of: "'shape': ("),
              let close = header[open.upperBound...].firstIndex(of: ")") else {
            throw bad("no shape in the header")
        }
        let shape = header[open.upperBound..<close].split(separator: ",")
            .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }.compactMap {
                Int($0)
            }
        let width = descr == "<f4" ? 4 : 8
        let start = headerStart + length
        guard let count = checkedCount(shape, width: width, limit: bytes.count - start),
              bytes.count - start == count * width else {
            throw bad("\(bytes.count - start) bytes of data do not hold shape \(shape) of \(descr)")
        }
        let values: [Float] = data.withUnsafeBytes { raw in
            (0..<count).map { i in
                width == 4
                    ? Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(
                        fromByteOffset: start + 4 * i, as: UInt32.self)))
                    : Float(Double(bitPattern: UInt64(littleEndian: raw.loadUnaligned(
                        fromByteOffset: start + 8 * i, as: UInt64.self))))
            }
        }
        return Tensor(shape: shape, data: values)
    }
}
