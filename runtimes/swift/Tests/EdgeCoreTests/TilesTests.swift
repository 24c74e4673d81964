import Foundation
import XCTest

@testable import EdgeCore

/// A decoder's tiles (Tiles.swift) against tests/fixtures/swift/tiles.json, which
/// tests/swift_fixtures.py writes from edge/core/tiles.py: the tiles' sizes, each size's
/// variant names, and the blend of random decoded tiles, overlaps down and across and tiles
/// cut short at the far edges, equal to Python's float32 output.
final class TilesTests: XCTestCase {
    func testTilesAreCutNamedAndBlendedAsPythonDoes() throws {
        let cases = try XCTUnwrap(try Fixtures.json("swift/tiles.json") as? [[String: Any]])
        XCTAssertEqual(cases.count, 3)
        for c in cases {
            let spec = try XCTUnwrap(c["tiling"] as? [String: Any])
            let tiling = Tiling(latentSize: spec["latent_size"] as! [Int],
                                latentStride: spec["latent_stride"] as! [Int],
                                scale: spec["scale"] as! Int)
            XCTAssertNil(tiling.problem)
            let (h, w, lead) = (c["height"] as! Int, c["width"] as! Int, c["lead"] as! Int)
            XCTAssertEqual(tiling.applies(height: h, width: w), c["applies"] as! Bool)
            let sizes = tiling.tileSizes(height: h, width: w)
            XCTAssertEqual(sizes, c["sizes"] as! [[Int]])
            let names = sizes.map { size in
                [nil, "first"].map { Tiling.tileVariant($0, size: size, base: sizes[0]) }
            }
            let want = (c["variants"] as! [[Any]]).map { $0.map { $0 as? String } }
            XCTAssertEqual(names, want)
            var blended = BlendedTiles(tiling, latentHeight: h, latentWidth: w, lead: lead)
            for t in c["tiles"] as! [[String: Any]] {
                let values = (t["values"] as! [Any]).map { Float(number($0)) }
                blended.add(t["i"] as! Int, t["j"] as! Int, values, h: t["h"] as! Int,
                            w: t["w"] as! Int)
            }
            let output = (c["output"] as! [Any]).map { Float(number($0)) }
            XCTAssertEqual(blended.output.count, output.count)
            let worst = zip(blended.output, output).map { abs($0 - $1) }.max() ?? 0
            XCTAssertEqual(worst, 0, "the blend differs from Python's by \(worst)")
        }
    }

    func testABadTilingSaysWhatIsWrong() {
        XCTAssertEqual(Tiling(latentSize: [3, 3], latentStride: [4, 2], scale: 8).problem,
                       "tiles latent_stride [4, 2] is longer than latent_size [3, 3]: " +
                       "tiles would leave gaps")
        XCTAssertNotNil(Tiling(latentSize: [3], latentStride: [2, 2], scale: 8).problem)
        XCTAssertNotNil(Tiling(latentSize: [3, 3], latentStride: [2, 2], scale: 0).problem)
    }
}
