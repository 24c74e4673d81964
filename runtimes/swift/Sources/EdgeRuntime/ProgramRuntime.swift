import EdgeCore
import Foundation

/// Which Apple framework runs a package's programs, by its manifest's layout: Core AI for
/// "coreai" (`--min-ios 27`, `.aimodel` programs), Core ML for "separate" and
/// "multifunction" (`.mlpackage`). A backend given the other framework's programs refuses
/// them naming the layout, before anything loads.
public enum ProgramRuntime: String, Sendable {
    case coreML = "Core ML", coreAI = "Core AI"

    public static func of(_ manifest: Manifest) -> ProgramRuntime {
        manifest.coreml.layout == "coreai" ? .coreAI : .coreML
    }

    /// The program folder or file this framework opens.
    public var programSuffix: String { self == .coreAI ? "aimodel" : "mlpackage" }

    /// Refuse `entry` where its program is the other framework's, or a Core AI program
    /// Core AI's native code could abort on (`checkCoreAIProgram`).
    public func check(_ entry: BlockEntry) throws {
        let suffix = entry.program.pathExtension
        guard suffix != programSuffix else {
            if self == .coreAI { try Self.checkCoreAIProgram(entry) }
            return
        }
        let other: ProgramRuntime = self == .coreAI ? .coreML : .coreAI
        let layout = other == .coreAI ? "coreai (--min-ios 27)" : "separate or multifunction " +
            "(--min-ios 17 or 18)"
        throw RuntimeError.package("block \(entry.key): \(entry.program.lastPathComponent) is " +
                                   "a \(other.rawValue) program (layout \(layout)); " +
                                   "the \(rawValue) backend runs .\(programSuffix) programs only")
    }
}

extension ProgramRuntime {
    /// A Core AI program is refused before Core AI reads it where `main.hash`, the sha256
    /// Core AI writes beside the bytecode, is not the manifest's digest of `main.mlirb`
    /// (which the package's verification compared with the file), or where the bytecode's
    /// sections do not cover it (MLIRBytecode): Core AI's Linux runtime aborted the process on
    /// a truncated one (runtimes/python/coreai_session.py check_program does the same).
    public static func checkCoreAIProgram(_ entry: BlockEntry) throws {
        let bytecode = entry.program.appendingPathComponent("main.mlirb")
        let hashFile = entry.program.appendingPathComponent("main.hash")
        let listed = entry.block.files.first { $0.path == entry.block.model + "/main.mlirb" }
        guard let written = try? Data(contentsOf: hashFile) else {
            throw RuntimeError.package("\(hashFile.path): Core AI's digest of the program " +
                                       "cannot be read (block \(entry.key))")
        }
        let hex = written.map { String(format: "%02x", $0) }.joined()
        if let listed, hex != listed.sha256 {
            throw RuntimeError.package("\(bytecode.path): its sha256 in the manifest is not " +
                                       "the one Core AI wrote beside it in main.hash (block " +
                                       "\(entry.key)): the program was changed after it was " +
                                       "made; export the package again")
        }
        do {
            try MLIRBytecode.checkFraming(try Data(contentsOf: bytecode, options: .alwaysMapped))
        } catch let error as MLIRBytecode.FramingError {
            throw RuntimeError.package("\(bytecode.path): not a whole Core AI program (block " +
                                       "\(entry.key)): the bytecode \(error); export the " +
                                       "package again")
        }
    }
}

extension Pipeline {
    /// The backend for a Core AI package: Core AI's own where the system has it (iOS 27,
    /// macOS 27), else refused naming the layout and what to export instead.
    public static func coreAIBackend(_ manifest: Manifest) throws -> BlockBackend {
        #if canImport(CoreAI)
        if #available(iOS 27, macOS 27, *) { return CoreAIBackend() }
        #endif
        throw RuntimeError.package("package \(manifest.model): its layout is coreai (Core " +
                                   "AI programs, iOS 27 or later); this system has no Core " +
                                   "AI: export it with --min-ios 18 (Core ML) to run it here")
    }
}
