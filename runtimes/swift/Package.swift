// swift-tools-version:5.9
// The Swift runtime for edge packages exported with `edge export --target iphone`.
//
// EdgeCore: Foundation only (manifest, sampler, tokenizer, tensors); its tests read the JSON
// fixtures that the Python side writes (tests/fixtures/), so the two runtimes are held to
// the same numbers. EdgeRuntime: CoreML, the block loader and the pipeline (Apple platforms).
import PackageDescription

let package = Package(
    name: "EdgeRuntime",
    platforms: [.iOS(.v17), .macOS(.v14)],
    products: [
        .library(name: "EdgeRuntime", targets: ["EdgeRuntime"]),
        .library(name: "EdgeCore", targets: ["EdgeCore"]),
    ],
    targets: [
        .target(name: "EdgeCore"),
        .target(name: "EdgeRuntime", dependencies: ["EdgeCore"]),
        .testTarget(name: "EdgeCoreTests", dependencies: ["EdgeCore"]),
    ]
)
