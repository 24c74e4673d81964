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

    /// Refuse `entry` where its program is the other framework's.
    public func check(_ entry: BlockEntry) throws {
        let suffix = entry.program.pathExtension
        guard suffix != programSuffix else { return }
        let other: ProgramRuntime = self == .coreAI ? .coreML : .coreAI
        let layout = other == .coreAI ? "coreai (--min-ios 27)" : "separate or multifunction " +
            "(--min-ios 17 or 18)"
        throw RuntimeError.package("block \(entry.key): \(entry.program.lastPathComponent) is " +
                                   "a \(other.rawValue) program (layout \(layout)); " +
                                   "the \(rawValue) backend runs .\(programSuffix) programs only")
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
