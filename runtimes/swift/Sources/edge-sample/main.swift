// edge-sample: generate a video from an iphone package with the Swift runtime, or check the
// runtime against a conformance bundle from `edge record`.
//
//   swift run edge-sample PACKAGE PROMPT [options] -o out.npy|out.gif
//   swift run edge-sample PACKAGE --bundle BUNDLE [-o out.npy]
//
// With --bundle on Apple platforms the package's blocks run through CoreML: each block is
// fed the bundle's recorded inputs and its error against the recorded outputs is reported,
// then the whole generation runs and its frames are compared with the bundle's. Elsewhere
// (Linux) no backend can run CoreML programs, so the bundle's recorded outputs answer the
// block calls while every input the Swift pipeline computes is checked against the
// recording (worst difference reported); the frames are then compared byte for byte.
// Arguments are parsed by hand: the toolchain has no argument parser and no outside Swift
// package can be fetched here.
import EdgeCore
import EdgeRuntime
import Foundation
#if canImport(CoreML)
import CoreML
#endif
#if canImport(ImageIO)
import ImageIO
import UniformTypeIdentifiers
#endif

let usage = """
    usage: edge-sample PACKAGE PROMPT [--negative-prompt TEXT] [--seed N | --latents F.npy]
                       [--steps N] [--guidance X] [--dynamic-guidance | --no-dynamic-guidance] \
    [--guidance-rescale X]
                       [--leap-after N] [--leap-steps N]
                       [--merge-steps N] [--cache-threshold X] [--guidance-steps K] \
    [--sigmas S1,S2,...] [--budget BYTES]
                       [--decode-timestep X] [--decode-noise-scale X] -o OUT.npy|OUT.gif
           edge-sample PACKAGE --bundle BUNDLE [--budget BYTES] [-o OUT.npy]
    """

struct Failure: Error, CustomStringConvertible { let description: String }

struct Options {
    var package = "", prompt: String?, output: String?, bundle: String?, negativePrompt: String?,
        latents: String?
    var seed: UInt64?, budget: Int?
    var steps: Int?, guidance: Double?, guidanceRescale: Double?, leapAfter: Int?, leapSteps: Int?,
        mergeSteps: Int?, cacheThreshold: Double?, guidanceSteps: Int?
    var dynamicGuidance: Bool?   // CogVideoX's dynamic guidance (cogvideox_ddim packages)
    var sigmas: [Double]?        // given noise levels, one a step (sets --steps)
    // a timestep-conditioned decoder's (LTX-Video)
    var decodeTimestep: Double?, decodeNoiseScale: Double?

    init(_ args: [String]) throws {
        var positional: [String] = []
        var i = 0
        func value(_ name: String) throws -> String {
            i += 1
            guard i < args.count else { throw Failure(description: "\(name) needs a value") }
            return args[i]
        }
        func number<T: LosslessStringConvertible>(_ name: String, _ type: T.Type) throws -> T {
            let text = try value(name)
            guard let n = T(text) else {
                // a whole number too large for the type is no typo: say which it is
                let digits = text.drop(while: { $0 == "-" || $0 == "+" })
                if !digits.isEmpty && digits.allSatisfy({ $0.isASCII && $0.isNumber }) {
                    throw Failure(description: "\(name) \(text): out of range (at most " +
                                               "\(Int.max))")
                }
                throw Failure(description: "\(name) \(text): not a number")
            }
            return n
        }
        while i < args.count {
            let arg = args[i]
            switch arg {
            case "-o", "--output": output = try value(arg)
            case "--bundle": bundle = try value(arg)
            case "--negative-prompt": negativePrompt = try value(arg)
            case "--latents": latents = try value(arg)
            case "--seed":   // 0 to 2^63 - 1: torch.randn's noise for it (EdgeCore TorchNoise)
                seed = try TorchNoise.seed(parsing: try value(arg), name: arg)
            case "--budget": budget = try number(arg, Int.self)
            case "--steps": steps = try number(arg, Int.self)
            case "--guidance": guidance = try number(arg, Double.self)
            case "--dynamic-guidance": dynamicGuidance = true
            case "--no-dynamic-guidance": dynamicGuidance = false
            case "--leap-after": leapAfter = try number(arg, Int.self)
            case "--leap-steps": leapSteps = try number(arg, Int.self)
            case "--merge-steps": mergeSteps = try number(arg, Int.self)
            case "--cache-threshold": cacheThreshold = try number(arg, Double.self)
            case "--guidance-steps": guidanceSteps = try number(arg, Int.self)
            case "--sigmas":   // numbers with commas between them, as `edge generate --sigmas`
                let text = try value(arg)
                let levels = text.split(separator: ",", omittingEmptySubsequences: false).map {
                    Double($0)
                }
                guard !levels.contains(where: { $0 == nil }) else {
                    throw Failure(description: "--sigmas \(text): give the noise " +
                                               "levels as numbers with commas " +
                                               "between them, e.g. 1,0.94,0.75,0.4")
                }
                sigmas = levels.compactMap { $0 }
            case "--guidance-rescale": guidanceRescale = try number(arg, Double.self)
            case "--decode-timestep": decodeTimestep = try number(arg, Double.self)
            case "--decode-noise-scale": decodeNoiseScale = try number(arg, Double.self)
            case "-h", "--help": throw Failure(description: usage)
            default:
                if arg.hasPrefix("-") && arg.count > 1 {
                    throw Failure(description: "unknown option \(arg)\n\(usage)")
                }
                positional.append(arg)
            }
            i += 1
        }
        guard let first = positional.first else { throw Failure(description: usage) }
        package = first
        prompt = positional.count > 1 ? positional[1] : nil
        if positional.count > 2 {
            throw Failure(description: "unexpected argument \(positional[2])\n\(usage)")
        }
        if bundle != nil {
            let given = [prompt.map { _ in "PROMPT" },
                         negativePrompt.map { _ in "--negative-prompt" },
                         latents.map { _ in "--latents" }, seed.map { _ in "--seed" },
                         steps.map { _ in "--steps" },
                         guidance.map { _ in "--guidance" },
                         dynamicGuidance.map {
                             $0 ? "--dynamic-guidance" : "--no-dynamic-guidance"
                         },
                         leapAfter.map { _ in "--leap-after" },
                         leapSteps.map { _ in "--leap-steps" },
                         mergeSteps.map { _ in "--merge-steps" },
                         cacheThreshold.map { _ in "--cache-threshold" },
                         guidanceSteps.map { _ in "--guidance-steps" },
                         sigmas.map { _ in "--sigmas" },
                         guidanceRescale.map { _ in "--guidance-rescale" },
                         decodeTimestep.map { _ in "--decode-timestep" },
                         decodeNoiseScale.map { _ in "--decode-noise-scale" }].compactMap { $0 }
            if !given.isEmpty {
                throw Failure(description: "--bundle runs the bundle's own prompt and " +
                                           "settings; drop \(given.joined(separator: ", "))")
            }
        } else {
            guard prompt != nil else { throw Failure(description: "no PROMPT\n\(usage)") }
            guard output != nil else {
                throw Failure(description: "no -o OUT.npy or OUT.gif\n\(usage)")
            }
            if seed != nil && latents != nil {
                throw Failure(description: "--seed and --latents: give one")
            }
        }
        if let output, !(output.hasSuffix(".npy") || output.hasSuffix(".gif")) {
            throw Failure(description: "-o \(output): write a .npy (uint8 " +
                                       "frames T x H x W x 3) or a .gif")
        }
        if let output { try Self.checkWritable(output) }
        #if !canImport(ImageIO)
        if let output, output.hasSuffix(".gif") {
            throw Failure(description: "-o \(output): writing GIF needs ImageIO " +
                                       "(Apple platforms); write .npy here")
        }
        #endif
    }

    /// Refuse an -o that cannot be written before any work (a folder, or a missing parent
    /// folder), rather than after the whole generation or replay.
    static func checkWritable(_ output: String) throws {
        let url = URL(fileURLWithPath: output)
        var isFolder: ObjCBool = false
        if FileManager.default.fileExists(atPath: url.path, isDirectory: &isFolder),
           isFolder.boolValue {
            throw Failure(description: "-o \(output): is a folder; name a file to write")
        }
        let parent = url.deletingLastPathComponent().path
        guard FileManager.default.fileExists(atPath: parent, isDirectory: &isFolder),
              isFolder.boolValue else {
            throw Failure(description: "-o \(output): the folder \(parent) does not exist")
        }
        guard FileManager.default.isWritableFile(atPath: parent) else {
            throw Failure(description: "-o \(output): the folder \(parent) is not writable")
        }
    }

    func configure(_ s: inout SamplerSettings) {
        if let steps { s.steps = steps }
        if let guidance { s.guidance = guidance }
        if let dynamicGuidance { s.dynamicGuidance = dynamicGuidance }
        if let leapAfter { s.leap = true; s.leapAfter = leapAfter }
        if let leapSteps { s.leap = true; s.leapSteps = leapSteps }
        if let mergeSteps { s.mergeSteps = mergeSteps }
        if let cacheThreshold { s.cacheThreshold = cacheThreshold }
        if let guidanceSteps { s.guidanceSteps = guidanceSteps }
        // given levels say how many steps there are, as Python's with_overrides; a --steps
        // against a package's own levels is refused by validate(), naming both
        if let sigmas {
            s.sigmas = sigmas
            if steps == nil { s.steps = sigmas.count }
        }
        if let guidanceRescale { s.guidanceRescale = guidanceRescale }
    }
}

func write(_ result: Pipeline.Result, to path: String) throws {
    let url = URL(fileURLWithPath: path)
    if path.hasSuffix(".npy") {
        try NumPyFile.write(frames: result.frames, height: result.height, width: result.width,
                            to: url)
        return
    }
    #if canImport(ImageIO)
    guard let dest = CGImageDestinationCreateWithURL(url as CFURL,
                                                     UTType.gif.identifier as CFString,
                                                     result.frames.count, nil) else {
        throw Failure(description: "-o \(path): cannot be written")
    }
    let delay = [kCGImagePropertyGIFDictionary: [kCGImagePropertyGIFDelayTime: 0.125]]
        as CFDictionary
    for frame in result.frames {
        let provider = CGDataProvider(data: Data(frame) as CFData)!
        let image = CGImage(width: result.width, height: result.height, bitsPerComponent: 8,
                            bitsPerPixel: 24,
                            bytesPerRow: result.width * 3, space: CGColorSpaceCreateDeviceRGB(),
                            bitmapInfo: CGBitmapInfo(rawValue: CGImageAlphaInfo.none.rawValue),
                            provider: provider,
                            decode: nil, shouldInterpolate: false, intent: .defaultIntent)!
        CGImageDestinationAddImage(dest, image, delay)
    }
    guard CGImageDestinationFinalize(dest) else {
        throw Failure(description: "-o \(path): the GIF could not be written")
    }
    #else
    throw Failure(description: "-o \(path): writing GIF needs ImageIO " +
                               "(Apple platforms); write .npy here")
    #endif
}

func pipeline(_ options: Options, backend: BlockBackend?) throws -> Pipeline {
    let root = URL(fileURLWithPath: options.package)
    func noticed(_ pipe: Pipeline) -> Pipeline {
        for notice in pipe.notices {
            FileHandle.standardError.write("notice: \(notice)\n".data(using: .utf8)!)
        }
        return pipe
    }
    if let backend {
        return noticed(try Pipeline(package: root, backend: backend, budget: options.budget))
    }
    #if canImport(CoreML)
    return noticed(try Pipeline(package: root, budget: options.budget))
    #else
    throw Failure(description: "running a package's blocks needs CoreML (Apple " +
                               "platforms); here edge-sample runs a conformance bundle: " +
                               "edge record PACKAGE PROMPT -o BUNDLE, then --bundle BUNDLE")
    #endif
}

func progress(_ done: Int, _ total: Int) {
    FileHandle.standardError.write("\rdenoising \(done)/\(total)".data(using: .utf8)!)
    if done == total { FileHandle.standardError.write("\n".data(using: .utf8)!) }
}

func runBundle(_ options: Options, _ path: String) throws {
    let bundle = try ConformanceBundle(contentsOf: URL(fileURLWithPath: path))
    #if canImport(CoreML)
    let pipe = try pipeline(options, backend: nil)
    print("per-block error against the bundle (recorded with \(bundle.recordedWith)):")
    for e in try pipe.blockErrors(against: bundle) {
        print(String(format: "  %-32@ %3d calls  max abs error %.3g (outputs up to %.3g)",
                     e.key as NSString, e.calls, e.maxAbsError, e.referenceMaxAbs))
    }
    let report = try pipe.run(bundle, onStep: progress)
    #else
    let replay = BundleReplay(bundle)
    let pipe = try pipeline(options, backend: replay)
    let report = try pipe.run(bundle, onStep: progress)
    guard replay.finished else {
        throw Failure(description: "\(path): the Swift pipeline made \(replay.next) of " +
                                   "the recording's \(bundle.calls.count) block calls")
    }
    print("replayed \(bundle.calls.count) block calls; every input the Swift pipeline computed " +
          "is the recording's within \(replay.tolerance): worst relative difference " +
          "\(String(format: "%.3g", replay.worstInputDifference))" +
          (replay.worstInputCall.map { " (\($0))" } ?? ""))
    #endif
    if let seed = bundle.seed, let drift = report.seedLatentsDifference {
        print("latents: drawn for the bundle's seed \(seed), worst difference " +
              "from the recorded ones \(String(format: "%.3g", drift))")
    }
    let frames = report.frames!
    if report.frameBytesDiffering == 0 {
        print("frames: \(frames.frames.count) x \(frames.height) " +
              "x \(frames.width), equal to the bundle's")
    } else {
        print("frames: \(report.frameBytesDiffering) bytes differ from the " +
              "bundle's, PSNR \(String(format: "%.2f", report.framesPSNR)) dB")
    }
    if let output = options.output { try write(frames, to: output); print("wrote \(output)") }
    #if !canImport(CoreML)
    if report.frameBytesDiffering > 0 {
        throw Failure(description: "replayed frames differ from the bundle's")
    }
    #endif
}

func main() -> Int32 {
    do {
        let options = try Options(Array(CommandLine.arguments.dropFirst()))
        if let bundle = options.bundle {
            try runBundle(options, bundle)
            return 0
        }
        let pipe = try pipeline(options, backend: nil)
        let latents = try options.latents.map { try NumPyFile.readFloats(URL(fileURLWithPath: $0)) }
        let result = try pipe.generate(options.prompt!, negativePrompt: options.negativePrompt,
                                       seed: options.seed,
                                       latents: latents, decodeTimestep: options.decodeTimestep,
                                       decodeNoiseScale: options.decodeNoiseScale,
                                       configure: options.configure, onStep: progress)
        try write(result, to: options.output!)
        print("wrote \(options.output!): \(result.frames.count) frames of \(result.width) " +
              "x \(result.height) in \(String(format: "%.1f", result.timings["total"] ?? 0)) s")
        return 0
    } catch {
        FileHandle.standardError.write("error: \(error)\n".data(using: .utf8)!)
        return 2
    }
}

exit(main())
