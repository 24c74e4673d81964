import EdgeCore
@testable import EdgeRuntime
import Foundation
import XCTest

/// What the Python side refuses, the Swift runtime refuses too, naming the same file or field.
final class BadPackageTests: ScratchTestCase {
    /// A private copy of the replay package, to damage.
    func copyOfPackage() throws -> (URL, ReplayFixtures) {
        let fx = try ReplayFixtures.load()
        let copy = scratch.appendingPathComponent("package")
        try FileManager.default.copyItem(at: fx.package, to: copy)
        return (copy, fx)
    }

    func open(_ root: URL, budget: Int? = nil) throws -> EdgePipeline {
        try EdgePipeline(package: root, backend: ReplayBackend(ReplayPlayer(try ReplayFixtures.load())), budget: budget)
    }

    /// Each manifest the Python side refuses (bad_manifests.json, with Python's message).
    func testRefusesWhatThePythonSideRefuses() throws {
        let fx = try ReplayFixtures.load()
        XCTAssertGreaterThanOrEqual(try assertRefusesWhatPythonRefuses(fx.folder.appendingPathComponent("bad_manifests.json")), 10)
    }

    func testRefusesAMissingFile() throws {
        let (root, _) = try copyOfPackage()
        let path = "models/transformer/pair_1.mlpackage/Data/com.apple.CoreML/weights/weight.bin"
        try FileManager.default.removeItem(at: root.appendingPathComponent(path))
        try assertRefused("missing", [path, "missing"]) { _ = try open(root) }
    }

    func testRefusesATruncatedFile() throws {
        let (root, _) = try copyOfPackage()
        let path = "models/vae_decoder/head.mlpackage/Data/com.apple.CoreML/weights/weight.bin"
        let url = root.appendingPathComponent(path)
        let data = try Data(contentsOf: url)
        try data.prefix(data.count / 2).write(to: url)
        try assertRefused("truncated", [path, "bytes", "truncated"]) { _ = try open(root) }
    }

    func testRefusesAnAlteredFileOfTheSameSize() throws {
        let (root, _) = try copyOfPackage()
        let path = "tokenizer/tokenizer.json"
        let url = root.appendingPathComponent(path)
        var data = try Data(contentsOf: url)
        data[data.count / 2] ^= 0x01
        try data.write(to: url)
        try assertRefused("altered", [path, "sha256"]) { _ = try open(root) }
    }

    func testRefusesAnUnlistedFile() throws {
        let (root, _) = try copyOfPackage()
        try Data("x".utf8).write(to: root.appendingPathComponent("models/extra.bin"))
        try assertRefused("unlisted", ["models/extra.bin", "not listed"]) { _ = try open(root) }
    }

    func testRefusesABudgetBelowTheLargestBlock() throws {
        let (root, _) = try copyOfPackage()
        try assertRefused("budget", ["text_encoder/embeddings", "smallest budget"]) { _ = try open(root, budget: 1_000_000) }
    }

    /// A block file changed on disk after the package was verified: refused by name when the
    /// loader comes to load it; nothing half-run is handed back.
    func testRefusesABlockFileChangedAfterVerification() throws {
        let (root, fx) = try copyOfPackage()
        let player = ReplayPlayer(fx)
        let pipe = try EdgePipeline(package: root, backend: ReplayBackend(player))
        let path = "models/vae_decoder/up_0.mlpackage/Data/com.apple.CoreML/weights/weight.bin"
        let url = root.appendingPathComponent(path)
        var data = try Data(contentsOf: url)
        data[0] ^= 0xFF
        try FileManager.default.removeItem(at: url)   // a new inode, as an editor's save makes
        try data.write(to: url)
        let c = fx.cases[0]
        player.start(c)
        try assertRefused("changed", [path, "changed on disk"]) {
            _ = try pipe.generate(c.prompt, latents: fx.tensor(c.latents), configure: fx.configure(c))
        }
    }

    func testRefusesLatentsOfAnotherShape() throws {
        let (root, _) = try copyOfPackage()
        let pipe = try open(root)
        try assertRefused("latents", ["latents", "[1, 4, 16, 8, 8]"]) {
            _ = try pipe.generate("a red circle", latents: Tensor(zeros: [1, 4, 8, 8, 8]))
        }
    }
}
