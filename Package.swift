// swift-tools-version:5.9
// The Swift runtime for edge packages exported with `edge export --target iphone`, its sources
// in runtimes/swift/. The manifest sits at the repository's root, where SwiftPM looks for it,
// so an app adds the runtime by the repository's URL and a version tag (Xcode: File > Add
// Package Dependencies...; or .package(url: ..., from: "0.1.0")); EdgeCore.runtimeVersion is
// that version, edge's own (tests/test_swift_package.py).
// Language mode: Swift 5 (tools version 5.9), built with Swift 6.3 on Linux and Apple.
//
// EdgeCore: Foundation only (manifest, sampler, tokenizer, tensors, SHA-256).
// EdgeRuntime: the block loader, the pipeline over a BlockBackend protocol and conformance bundles
// (edge record); builds everywhere. Its Apple-only files (CoreMLBackend, MultiArray, VideoWriter)
// sit behind `#if canImport(CoreML)` / AVFoundation. Tests read the fixtures the Python side writes
// (tests/fixtures/, and the replay fixtures tests/test_swift_runtime.py writes).
// edge-sample: `swift run edge-sample PACKAGE PROMPT -o out.npy`, or `--bundle BUNDLE`.
// edge-noise: `swift run -c release edge-noise --seed 3 --shape 16,21,60,104` times a seed's noise.
import PackageDescription

let sources = "runtimes/swift/Sources", tests = "runtimes/swift/Tests"

let package = Package(
    name: "EdgeRuntime",
    platforms: [.iOS(.v17), .macOS(.v14)],
    products: [
        .library(name: "EdgeRuntime", targets: ["EdgeRuntime"]),
        .library(name: "EdgeCore", targets: ["EdgeCore"]),
        .library(name: "EdgeDemoKit", targets: ["EdgeDemoKit"]),
        .executable(name: "edge-sample", targets: ["edge-sample"]),
        .executable(name: "edge-noise", targets: ["edge-noise"]),
    ],
    targets: [
        .target(name: "EdgeCore", path: "\(sources)/EdgeCore"),
        .target(name: "EdgeRuntime", dependencies: ["EdgeCore"], path: "\(sources)/EdgeRuntime"),
        // the demo app's non-UI part (ios_demo/EdgeDemo/DemoModel.swift is its SwiftUI face)
        .target(name: "EdgeDemoKit", dependencies: ["EdgeRuntime", "EdgeCore"],
                path: "\(sources)/EdgeDemoKit"),
        // the command-line sample: generate from a package, or run a conformance bundle
        .executableTarget(name: "edge-sample", dependencies: ["EdgeRuntime", "EdgeCore"],
                          path: "\(sources)/edge-sample"),
        // times the seed's noise (TorchNoise) for benchmarks/noise.py: one JSON line
        .executableTarget(name: "edge-noise", dependencies: ["EdgeCore"],
                          path: "\(sources)/edge-noise"),
        .testTarget(name: "EdgeCoreTests", dependencies: ["EdgeCore"],
                    path: "\(tests)/EdgeCoreTests"),
        .testTarget(name: "EdgeRuntimeTests",
                    dependencies: ["EdgeRuntime", "EdgeCore", "EdgeDemoKit"],
                    path: "\(tests)/EdgeRuntimeTests"),
    ]
)
