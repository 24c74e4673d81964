// edge-noise: time the seed's noise (EdgeCore TorchNoise, PyTorch's torch.randn for a seed)
// for benchmarks/noise.py, which compares it with torch.randn in the same run.
//
//   swift run -c release edge-noise --seed 3 --shape 16,21,60,104 [--repeat 5]
//
// prints one JSON line: {"count": values drawn, "best_s": the fastest of the repeats in
// seconds, "sum": the float64 sum of the values (to check the draw against torch's)}.
import EdgeCore
import Foundation

struct Failure: Error, CustomStringConvertible { let description: String }

let usage = "usage: edge-noise --seed N --shape D0,D1,... [--repeat K]"

func parse(_ args: [String]) throws -> (seed: UInt64, shape: [Int], repeats: Int) {
    var seed: UInt64?, shape: [Int]?, repeats = 5
    var i = 0
    func value(_ name: String) throws -> String {
        i += 1
        guard i < args.count else { throw Failure(description: "\(name) needs a value; \(usage)") }
        return args[i]
    }
    while i < args.count {
        let arg = args[i]
        switch arg {
        case "--seed": seed = try TorchNoise.seed(parsing: try value(arg), name: "--seed")
        case "--shape":
            let text = try value(arg)
            let dims = text.split(separator: ",", omittingEmptySubsequences: false).map { Int($0) }
            guard !dims.isEmpty, dims.allSatisfy({ ($0 ?? -1) >= 0 }) else {
                throw Failure(description: "--shape \(text): sizes separated " +
                                           "by commas, e.g. 16,21,60,104")
            }
            shape = dims.map { $0! }
        case "--repeat":
            let text = try value(arg)
            guard let n = Int(text), n >= 1 else {
                throw Failure(description: "--repeat \(text): a whole number from 1")
            }
            repeats = n
        case "-h", "--help": throw Failure(description: usage)
        default: throw Failure(description: "unknown argument \(arg); \(usage)")
        }
        i += 1
    }
    guard let seed, let shape else { throw Failure(description: usage) }
    return (seed, shape, repeats)
}

func main() -> Int32 {
    do {
        let (seed, shape, repeats) = try parse(Array(CommandLine.arguments.dropFirst()))
        let (count, overflow) = shape.reduce((1, false)) { acc, d in
            let (p, o) = acc.0.multipliedReportingOverflow(by: d)
            return (p, acc.1 || o)
        }
        guard !overflow else { throw Failure(description: "--shape \(shape): too many values") }
        let buffer = UnsafeMutableBufferPointer<Float>.allocate(capacity: count)
        defer { buffer.deallocate() }
        var best = Double.infinity
        for _ in 0..<repeats {
            let start = DispatchTime.now().uptimeNanoseconds
            try TorchNoise.fill(buffer, seed: seed)
            best = min(best, Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9)
        }
        let sum = buffer.reduce(0.0) { $0 + Double($1) }
        print("{\"count\":\(count),\"best_s\":\(best),\"sum\":\(sum)}")
        return 0
    } catch {
        FileHandle.standardError.write("error: \(error)\n".data(using: .utf8)!)
        return 2
    }
}

exit(main())
