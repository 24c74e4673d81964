import XCTest
@testable import EdgeCore

/// Reading a padded framework buffer in row-major order (Core ML's and Core AI's outputs).
final class StridedOffsetTests: XCTestCase {
    func testContiguousStridesAreTheIndexAndPaddedRowsAreSkipped() {
        XCTAssertEqual((0..<6).map { stridedOffset(of: $0, shape: [2, 3], strides: [3, 1]) },
                       Array(0..<6))
        // rows padded to 4 values: the 4th slot of each row is never read
        XCTAssertEqual((0..<6).map { stridedOffset(of: $0, shape: [2, 3], strides: [4, 1]) },
                       [0, 1, 2, 4, 5, 6])
        // a transposed view (column-major storage)
        XCTAssertEqual((0..<6).map { stridedOffset(of: $0, shape: [2, 3], strides: [1, 2]) },
                       [0, 2, 4, 1, 3, 5])
    }
}
