import Foundation

/// What the runtime refuses or stops on. Every message names the file, block or field.
public enum RuntimeError: Error, CustomStringConvertible, Equatable {
    case package(String)      // a missing, altered or unlisted file; a path that escapes
    case budget(String)       // a memory budget that cannot hold the largest block
    case block(String)        // a block that does not take or give what the manifest says
    case cancelled            // the app asked the generation to stop

    public var description: String {
        switch self {
        case .package(let why), .budget(let why), .block(let why): return why
        case .cancelled: return "generation cancelled"
        }
    }
}
