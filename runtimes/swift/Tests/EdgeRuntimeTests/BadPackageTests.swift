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

    func open(_ root: URL, budget: Int? = nil) throws -> Pipeline {
        try Pipeline(package: root,
                         backend: ReplayBackend(ReplayPlayer(try ReplayFixtures.load())),
                         budget: budget)
    }

    /// Each manifest the Python side refuses (bad_manifests.json, with Python's message).
    func testRefusesWhatThePythonSideRefuses() throws {
        let fx = try ReplayFixtures.load()
        XCTAssertGreaterThanOrEqual(try assertRefusesWhatPythonRefuses(
            fx.folder.appendingPathComponent("bad_manifests.json")), 10)
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

    /// A file the manifest does not list (a README someone added) is named in a notice and
    /// left alone: the package loads and runs what its manifest lists (as the Python side).
    func testNamesAnUnlistedFileAndLoads() throws {
        let (root, _) = try copyOfPackage()
        try Data("x".utf8).write(to: root.appendingPathComponent("models/extra.bin"))
        let pipe = try open(root)
        XCTAssertEqual(pipe.notices.count, 1)
        XCTAssertTrue(pipe.notices[0].contains("models/extra.bin")
                      && pipe.notices[0].contains("not checked and not used"),
                      pipe.notices[0])
        XCTAssertEqual(try open(try ReplayFixtures.load().package).notices, [],
                       "an untouched package has nothing to say")
    }

    /// manifest.json edited by `change` and written back.
    func editManifest(_ root: URL, _ change: (inout [String: Any]) throws -> Void) throws {
        let url = root.appendingPathComponent("manifest.json")
        var body = try JSONSerialization.jsonObject(with: Data(contentsOf: url)) as! [String: Any]
        try change(&body)
        try JSONSerialization.data(withJSONObject: body).write(to: url)
    }

    /// A vocabulary larger than the text encoder's embedding table is refused at load, naming
    /// the tokenizer file and the manifest field; one that fits loads.
    func testRefusesAVocabularyLargerThanTheEmbeddingTable() throws {
        let (root, _) = try copyOfPackage()
        var tokenizerPath = ""
        try editManifest(root) { body in
            let tokenizer = body["tokenizer"] as! [String: Any]
            tokenizerPath = (tokenizer["files"] as! [[String: Any]])[0]["path"] as! String
        }
        let size = try vocabularySize(
            ofTokenizerJSON: Data(contentsOf: root.appendingPathComponent(tokenizerPath)))
        XCTAssertGreaterThan(size, 1000)
        for rows in [size, size - 1] {
            try editManifest(root) { body in
                var tokenizer = body["tokenizer"] as! [String: Any]
                tokenizer["embedding_rows"] = rows
                body["tokenizer"] = tokenizer
            }
            if rows == size {
                XCTAssertNoThrow(try open(root))
            } else {
                try assertRefused("vocabulary", [tokenizerPath, "vocabulary of \(size) tokens",
                                                 "\(rows) rows", "embedding_rows"]) {
                    _ = try open(root)
                }
            }
        }
    }

    /// A learned null caption holding NaN (a consistent package: size and sha256 rewritten) is
    /// refused at load, not after a generation of NaN frames.
    func testRefusesANullCaptionThatIsNotFinite() throws {
        let (root, _) = try copyOfPackage()
        var path = ""
        try editManifest(root) { body in
            let conditioning = body["conditioning"] as! [String: Any]
            path = (conditioning["null_caption_f32"] as! [String: Any])["path"] as! String
        }
        let url = root.appendingPathComponent(path)
        var raw = try Data(contentsOf: url)
        withUnsafeBytes(of: Float.nan.bitPattern.littleEndian) {
            raw.replaceSubrange(4..<8, with: $0)
        }
        try raw.write(to: url)
        let digest = try PackageFiles.sha256Hex(of: url)
        func fixed(_ value: Any) -> Any {   // every record of the file gets its new digest
            if var record = value as? [String: Any] {
                if record["path"] as? String == path {
                    record["sha256"] = digest
                    record["bytes"] = raw.count
                }
                return record.mapValues(fixed)
            }
            if let list = value as? [Any] { return list.map(fixed) }
            return value
        }
        try editManifest(root) { body in body = fixed(body) as! [String: Any] }
        try assertRefused("NaN null caption", [path, "1 of its", "not finite"]) {
            _ = try open(root)
        }
    }

    func testRefusesABudgetBelowTheLargestBlock() throws {
        let (root, _) = try copyOfPackage()
        try assertRefused("budget", ["text_encoder/embeddings", "smallest budget"]) {
            _ = try open(root, budget: 1_000_000)
        }
    }

    /// A block file changed on disk after the package was verified: refused by name when the
    /// loader comes to load it; nothing half-run is handed back.
    func testRefusesABlockFileChangedAfterVerification() throws {
        let (root, fx) = try copyOfPackage()
        let player = ReplayPlayer(fx)
        let pipe = try Pipeline(package: root, backend: ReplayBackend(player))
        let path = "models/vae_decoder/up_0.mlpackage/Data/com.apple.CoreML/weights/weight.bin"
        let url = root.appendingPathComponent(path)
        var data = try Data(contentsOf: url)
        data[0] ^= 0xFF
        try FileManager.default.removeItem(at: url)   // a new inode, as an editor's save makes
        try data.write(to: url)
        let c = fx.cases[0]
        player.start(c)
        try assertRefused("changed", [path, "changed on disk"]) {
            _ = try pipe.generate(c.prompt, latents: fx.tensor(c.latents),
                                  configure: fx.configure(c))
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
