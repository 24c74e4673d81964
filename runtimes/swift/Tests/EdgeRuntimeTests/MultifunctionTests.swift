import EdgeCore
@testable import EdgeRuntime
import Foundation
import XCTest

/// A multifunction package (iOS 18, `--min-ios 18`): a block's variants are functions of the
/// block's own program, so the loader's entries for them name the same program and files
/// with their function (what CoreMLBackend passes as MLModelConfiguration.functionName).
final class MultifunctionTests: XCTestCase {
    static let manifestURL = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent(
            "tests/fixtures/swift/manifest_iphone.json")

    func testVariantsAreFunctionsOfTheBlocksProgram() throws {
        let manifest = try ManifestReader.decode(Data(contentsOf: Self.manifestURL))
        XCTAssertEqual(manifest.coreml.layout, "multifunction")
        let entries = try Pipeline.entries(manifest, root: URL(fileURLWithPath: "/package"))
        let byKey = Dictionary(uniqueKeysWithValues: entries.map { ($0.key, $0) })
        var variants = 0
        for comp in manifest.components {
            for block in comp.blocks {
                let base = byKey["\(comp.name)/\(block.name)"]!
                // a block without variants is a plain program; with them, the "main" function
                XCTAssertEqual(base.function, (block.variants ?? [:]).isEmpty ? nil : "main",
                               base.key)
                for name in (block.variants ?? [:]).keys {
                    let entry = byKey["\(comp.name)/\(block.name)#\(name)"]!
                    XCTAssertEqual(entry.function, name, entry.key)
                    XCTAssertEqual(entry.program, base.program, "\(entry.key): one program " +
                        "for the block and its variants")
                    XCTAssertEqual(entry.paths, base.paths)
                    XCTAssertEqual(entry.digest, base.digest)
                    variants += 1
                }
            }
        }
        XCTAssertGreaterThan(variants, 0, "the fixture has no variants to check")
    }
}
