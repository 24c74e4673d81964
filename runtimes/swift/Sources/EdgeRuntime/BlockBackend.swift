import EdgeCore
import Foundation

/// One program the loader can load: a block, or one variant of a block (e.g. its TDTM
/// program), with the files it is made of.
public struct BlockEntry {
    public let key: String             // "transformer/pair_0", or "transformer/pair_0#tdtm"
    public let block: Manifest.Block   // names, shapes and dtypes of its inputs and outputs
    public let program: URL            // the block's (or variant's) .mlpackage folder
    public let function: String?       // the function to load of a multifunction program
    public let files: [URL]            // every file of the program, checked at load
    public let paths: [String]         // the same files as the manifest lists them
    public let weightBytes: Int        // what it occupies once loaded (the budget's unit)
    public let digest: String          // of its files' sha256s: names a compiled copy

    public init(key: String, block: Manifest.Block, program: URL, function: String? = nil,
                files: [URL],
                paths: [String]? = nil, weightBytes: Int, digest: String) {
        self.key = key; self.block = block; self.program = program; self.function = function
        self.files = files
        self.paths = paths ?? files.map(\.path)
        self.weightBytes = weightBytes; self.digest = digest
    }
}

/// What runs blocks: CoreML on Apple platforms (CoreMLBackend); in tests, a backend that
/// replays the Python runtime's recorded block calls, or a fake one. The loader decides
/// when a block is loaded and unloaded; the backend only makes a loaded block of an entry.
public protocol BlockBackend: AnyObject {
    /// Load `entry` (called on the loader's background queue, one load at a time).
    func load(_ entry: BlockEntry) throws -> LoadedBlock
}

/// A loaded block: inputs by name (the manifest's signatures) -> outputs by name. Freed when
/// the loader drops its last reference.
public protocol LoadedBlock: AnyObject {
    func predict(_ inputs: [String: Tensor]) throws -> [String: Tensor]
}
