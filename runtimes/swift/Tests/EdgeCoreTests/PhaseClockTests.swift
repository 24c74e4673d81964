import Foundation
import XCTest
@testable import EdgeCore

final class PhaseClockTests: XCTestCase {
    struct Stop: Error {}

    /// Each phase's seconds under its name, in the order the phases ran, a phase that throws
    /// recorded too, and a total that holds them all.
    func testPhasesAreRecordedInOrderWithATotalThatHoldsThem() throws {
        var clock = PhaseClock()
        let value = clock.phase("text_encoder") { () -> Int in
            Thread.sleep(forTimeInterval: 0.01)
            return 7
        }
        XCTAssertEqual(value, 7)
        XCTAssertThrowsError(try clock.phase("transformer") { () throws -> Int in
            Thread.sleep(forTimeInterval: 0.01)
            throw Stop()
        })
        clock.phase("vae_decoder") { Thread.sleep(forTimeInterval: 0.01) }
        let seconds = clock.finish()
        XCTAssertEqual(clock.order, ["text_encoder", "transformer", "vae_decoder", "total"])
        let phases = ["text_encoder", "transformer", "vae_decoder"].map { seconds[$0]! }
        XCTAssertTrue(phases.allSatisfy { $0 >= 0.01 }, "\(seconds)")
        XCTAssertGreaterThanOrEqual(seconds["total"]!, phases.reduce(0, +))
    }
}
