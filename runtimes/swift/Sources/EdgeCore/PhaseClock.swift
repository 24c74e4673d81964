import Foundation

/// Wall seconds of a generation's phases, by name, and the whole (`total`, from the clock's
/// making to `finish`): `Pipeline.Result.timings`, as the Python runtime's PhaseClock and the
/// page's record them (`last_run["wall_s"]`, `lastRun.wall_s`). `order` keeps the phases'
/// names in the order they ran (a Swift dictionary keeps none).
public struct PhaseClock {
    public let started = Date()
    public private(set) var seconds: [String: Double] = [:]
    public private(set) var order: [String] = []

    public init() {}

    /// `work`'s result, its wall seconds recorded under `name` (also when it throws).
    public mutating func phase<T>(_ name: String, _ work: () throws -> T) rethrows -> T {
        let began = Date()
        defer {
            seconds[name] = Date().timeIntervalSince(began)
            order.append(name)
        }
        return try work()
    }

    /// The phases' seconds and `total`.
    public mutating func finish() -> [String: Double] {
        seconds["total"] = Date().timeIntervalSince(started)
        order.append("total")
        return seconds
    }
}
