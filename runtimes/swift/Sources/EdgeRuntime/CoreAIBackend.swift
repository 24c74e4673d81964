#if canImport(CoreAI)
import CoreAI
import EdgeCore
import Foundation

/// The iOS 27 backend for Core AI packages (layout "coreai"): one `AIModel` per block's
/// `.aimodel`, a block or variant loaded as its function of it (`loadFunction(named:)`);
/// Core AI specializes a model for the device on its first load and caches the result
/// (AIModelCache.default). Dropping the loaded function frees its weights and buffers: the
/// loader's budget holds. Core AI's calls are async while the loader and the pipeline run
/// on their own threads, so each call waits here for its task (`waited`).
@available(iOS 27, macOS 27, *)
public final class CoreAIBackend: BlockBackend {
    let options: SpecializationOptions

    public init(options: SpecializationOptions = .default) { self.options = options }

    public func load(_ entry: BlockEntry) throws -> LoadedBlock {
        try ProgramRuntime.coreAI.check(entry)
        let url = entry.program, options = self.options
        let model = try waited { try await AIModel(contentsOf: url, options: options) }
        let name = entry.function ?? "main"
        guard let function = try model.loadFunction(named: name) else {
            throw RuntimeError.package("block \(entry.key): \(url.lastPathComponent) has " +
                                       "no function \(name) (it " +
                                       "has: \(model.functionNames.joined(separator: ", ")))")
        }
        return CoreAIBlock(function: function, entry: entry)
    }
}

@available(iOS 27, macOS 27, *)
final class CoreAIBlock: LoadedBlock {
    let function: InferenceFunction
    let entry: BlockEntry

    init(function: InferenceFunction, entry: BlockEntry) {
        self.function = function
        self.entry = entry
    }

    func predict(_ inputs: [String: Tensor]) throws -> [String: Tensor] {
        var arrays: [String: NDArray] = [:]
        for s in entry.block.inputs {
            guard let value = inputs[s.name], value.shape == s.shape else {
                throw RuntimeError.block("block \(entry.key): input \(s.name) " +
                                         "missing or not of shape \(s.shape)")
            }
            arrays[s.name] = s.dtype == "int32" ? NDArray(scalars: value.data.map { Int32($0) },
                                                          shape: s.shape)
                : NDArray(scalars: value.data, shape: s.shape)
        }
        let function = self.function, names = entry.block.outputs.map(\.name), key = entry.key
        return try waited {
            var outputs = try await function.run(inputs: arrays)
            var tensors: [String: Tensor] = [:]
            for name in names {
                guard let array = outputs.remove(name)?.ndArray else {
                    throw RuntimeError.block("block \(key): Core AI gave no output \(name)")
                }
                tensors[name] = try Self.tensor(array, key: key, name: name)
            }
            return tensors
        }
    }

    /// An output as float32 values in row-major order (Core AI may give float16, strided).
    static func tensor(_ array: NDArray, key: String, name: String) throws -> Tensor {
        func values<T: BitwiseCopyable>(_ type: T.Type, _ convert: (T) -> Float) throws -> Tensor {
            let view = array.view(as: type)
            guard view.interleaveLayout == nil else {   // its strides would be block strides
                throw RuntimeError.block("block \(key): output \(name) has an interleaved layout")
            }
            return view.withUnsafePointer { pointer, shape, strides in
                let dims = (0..<shape.count).map { shape[$0] }, steps = (0..<strides.count).map {
                    strides[$0]
                }
                let count = dims.reduce(1, *)
                let out = (0..<count).map {
                    convert(pointer[stridedOffset(of: $0, shape: dims, strides: steps)])
                }
                return Tensor(shape: dims, data: out)
            }
        }
        switch array.scalarType {
        case .float32: return try values(Float.self) { $0 }
        case .float16: return try values(Float16.self) { Float($0) }
        default: throw RuntimeError.block("block \(key): output \(name) " +
                                          "is \(array.scalarType), not float32 or float16")
        }
    }
}

/// Runs an async Core AI call to its end from a synchronous caller (a loader or pipeline
/// thread, never the main actor).
@available(iOS 27, macOS 27, *)
func waited<T>(_ work: @escaping () async throws -> T) throws -> T {
    let box = WaitedResult<T>(), done = DispatchSemaphore(value: 0)
    Task {
        do { box.result = .success(try await work()) } catch { box.result = .failure(error) }
        done.signal()
    }
    done.wait()
    return try box.result!.get()
}

/// Where the task leaves its result: written once before the semaphore is signalled, read
/// after the wait.
final class WaitedResult<T>: @unchecked Sendable { var result: Result<T, Error>? }
#endif
