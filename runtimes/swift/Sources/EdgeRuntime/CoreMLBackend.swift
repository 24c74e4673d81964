#if canImport(CoreML)
import CoreML
import EdgeCore
import Foundation

/// The Apple-platform backend for Core ML packages (layouts separate and multifunction; a Core AI
/// package runs through CoreAIBackend): one `MLModel` per block (or block variant). An `.mlpackage`
/// is compiled to `.mlmodelc` on the device once (MLModel.compileModel) and kept under
/// Caches/edge-compiled by the digest of its files, so a new export compiles anew. In a
/// multifunction package (iOS 18) a block and its variants are functions of one program sharing one
/// weight file: compiled once, each loaded with its function name.
public final class CoreMLBackend: BlockBackend {
    let configuration: MLModelConfiguration
    let cacheFolder: URL
    let outputPrefix: String

    public init(computeUnits: MLComputeUnits, outputPrefix: String, cacheFolder: URL? = nil) {
        configuration = MLModelConfiguration()
        configuration.computeUnits = computeUnits
        self.outputPrefix = outputPrefix
        self.cacheFolder = cacheFolder
            ?? FileManager.default.urls(for: .cachesDirectory, in: .userDomainMask)[0]
                .appendingPathComponent("edge-compiled")
    }

    public static func units(_ name: String) -> MLComputeUnits {
        switch name {
        case "cpuOnly": return .cpuOnly
        case "cpuAndGPU": return .cpuAndGPU
        case "all": return .all
        default: return .cpuAndNeuralEngine
        }
    }

    public func load(_ entry: BlockEntry) throws -> LoadedBlock {
        try ProgramRuntime.coreML.check(entry)
        var config = configuration
        if let function = entry.function {
            guard #available(iOS 18, macOS 15, *) else {
                throw RuntimeError.package("block \(entry.key): its program is " +
                                           "multifunction (iOS 18, macOS 15); export " +
                                           "the package with --min-ios 17 for this system")
            }
            config = configuration.copy() as! MLModelConfiguration
            config.functionName = function
        }
        return CoreMLBlock(model: try MLModel(contentsOf: try compiled(entry),
                                              configuration: config),
                           entry: entry, outputPrefix: outputPrefix)
    }

    func compiled(_ entry: BlockEntry) throws -> URL {
        // by program (component folder and file), not by key: a block's functions share one
        // compiled model, and the digest of its files names this export's copy
        let name = entry.program.deletingLastPathComponent().lastPathComponent + "_"
            + entry.program.deletingPathExtension().lastPathComponent
        let target = cacheFolder.appendingPathComponent("\(name)-\(entry.digest).mlmodelc")
        if FileManager.default.fileExists(atPath: target.path) { return target }
        let temporary = try MLModel.compileModel(at: entry.program)
        try FileManager.default.createDirectory(at: cacheFolder, withIntermediateDirectories: true)
        try? FileManager.default.removeItem(at: target)
        try FileManager.default.moveItem(at: temporary, to: target)
        return target
    }
}

final class CoreMLBlock: LoadedBlock {
    let model: MLModel
    let entry: BlockEntry
    let outputPrefix: String

    init(model: MLModel, entry: BlockEntry, outputPrefix: String) {
        self.model = model; self.entry = entry; self.outputPrefix = outputPrefix
    }

    func predict(_ inputs: [String: Tensor]) throws -> [String: Tensor] {
        var features: [String: MLFeatureValue] = [:]
        for s in entry.block.inputs {
            features[s.name] = MLFeatureValue(
                multiArray: try MultiArray.make(inputs[s.name]!, signature: s))
        }
        let out = try model.prediction(from: try MLDictionaryFeatureProvider(dictionary: features))
        var outputs: [String: Tensor] = [:]
        for s in entry.block.outputs {
            guard let array = out.featureValue(for: outputPrefix + s.name)?.multiArrayValue else {
                throw RuntimeError.block("block \(entry.key): no output \(outputPrefix + s.name)")
            }
            outputs[s.name] = try MultiArray.tensor(array)
        }
        return outputs
    }
}

extension Pipeline {
    /// A pipeline that runs the package's blocks with the framework its layout names: Core AI
    /// for a `--min-ios 27` package (iOS 27 and later), else CoreML on the manifest's compute
    /// units (or `computeUnits`).
    public convenience init(package root: URL, budget: Int? = nil, verify: Bool = true,
                            computeUnits: MLComputeUnits? = nil) throws {
        try self.init(package: root, budget: budget, verify: verify, makeBackend: { manifest in
            if ProgramRuntime.of(manifest) == .coreAI {
                return try Pipeline.coreAIBackend(manifest)
            }
            return CoreMLBackend(
                computeUnits: computeUnits ?? CoreMLBackend.units(manifest.coreml.computeUnits),
                outputPrefix: manifest.coreml.outputPrefix)
        })
    }
}
#endif
