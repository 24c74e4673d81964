import XCTest
@testable import EdgeCore

/// The variant choice against edge/core/manifest_schema.py's (tests/test_guidance_cutoff.py
/// test_block_variant: the same cases).
final class BlockVariantsTests: XCTestCase {
    func testCallVariantsNameTheMergedAndCaptionHalfForms() {
        let names = [false, true].flatMap { m in
            [false, true].map { BlockVariants.callVariant(merged: m, alone: $0) }
        }
        XCTAssertEqual(names, [nil, "unguided", "tdtm", "tdtm_unguided"])
    }

    func testMergingWhereABlockMergesTheCaptionHalfOnEveryBlock() throws {
        let pair: Set = ["tdtm", "unguided", "tdtm_unguided"], prologue: Set = ["unguided"]
        XCTAssertEqual(try [false, true].map {
                           try BlockVariants.blockVariant(
                               pair, BlockVariants.callVariant(merged: true, alone: $0))
                       },
                       ["tdtm", "tdtm_unguided"])
        XCTAssertEqual(try [false, true].map {
                           try BlockVariants.blockVariant(
                               prologue, BlockVariants.callVariant(merged: true, alone: $0))
                       },
                       [nil, "unguided"])
        XCTAssertEqual(try BlockVariants.blockVariant(["first"], "first"), "first")
        XCTAssertThrowsError(try BlockVariants.blockVariant(["tdtm"], "unguided")) {
            XCTAssertEqual("\($0)", "the block has no variant unguided (it has: tdtm)")
        }
        // a merging block without its merged caption half is not run unmerged in its place
        XCTAssertThrowsError(
            try BlockVariants.blockVariant(["tdtm", "unguided"], "tdtm_unguided")) {
            XCTAssertTrue("\($0)".contains("tdtm_unguided"))
        }
    }
}
