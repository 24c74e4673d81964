import EdgeDemoKit
import EdgeRuntime
import Foundation
import SwiftUI

/// The form's state and the SwiftUI side of a generation. The work itself (pipeline reuse,
/// settings, timing rows) is EdgeDemoKit's DemoSession, which builds and is tested on Linux.
@MainActor
final class DemoModel: ObservableObject {
    @Published var prompt = "a red circle moving left"
    @Published var leap = false            // Linear Proportional Leap
    @Published var tdtm = false            // temporal token merging for the first half
    @Published var useBudget = false       // keep at most `budgetMiB` of blocks loaded
    @Published var budgetMiB = 64.0
    @Published var seed = 0
    @Published var progress = 0.0
    @Published var status = "No package loaded"
    @Published var videoURL: URL?
    @Published var timings: [(String, String)] = []
    @Published var running = false

    private let session = DemoSession { url, budget in
        try Pipeline(package: url, budget: budget)
    }
    private var packageURL: URL?
    private let cancelFlag = CancellationFlag()

    /// The package bundled with the app (a folder reference named tiny-sora-iphone).
    func loadBundled() {
        guard let url = Bundle.main.url(forResource: "tiny-sora-iphone", withExtension: nil) else {
            status = "No bundled package: add tiny-sora-iphone to the app, or pick one from Files"
            return
        }
        packageURL = url
        status = "Package: \(url.lastPathComponent)"
    }

    /// A package folder picked with the Files app (security-scoped: copied into the app's
    /// Documents so it stays readable).
    func pick(_ url: URL) {
        let scoped = url.startAccessingSecurityScopedResource()
        defer { if scoped { url.stopAccessingSecurityScopedResource() } }
        let target = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0]
            .appendingPathComponent(url.lastPathComponent)
        do {
            try? FileManager.default.removeItem(at: target)
            try FileManager.default.copyItem(at: url, to: target)
            packageURL = target
            status = "Package: \(url.lastPathComponent)"
        } catch {
            status = "Cannot copy \(url.lastPathComponent): \(error.localizedDescription)"
        }
    }

    func cancel() { cancelFlag.cancel() }

    func generate() {
        guard let packageURL, !running else { return }
        running = true
        cancelFlag.reset()
        progress = 0
        status = "Verifying and generating…"
        var options = DemoOptions()
        options.prompt = prompt
        options.leap = leap
        options.tdtm = tdtm
        options.seed = seed
        options.budgetMiB = useBudget ? budgetMiB : nil
        let (session, flag) = (self.session, cancelFlag)
        Task.detached(priority: .userInitiated) {
            do {
                let report = try session.run(package: packageURL, options: options,
                                             onProgress: { value in
                    Task { @MainActor in self.progress = value }
                }, isCancelled: { flag.isCancelled })
                let url = FileManager.default.temporaryDirectory
                    .appendingPathComponent("edge-demo.mp4")
                let result = report.result
                try await VideoWriter.writeMP4(result.frames, width: result.width,
                                               height: result.height, to: url)
                await MainActor.run {
                    self.timings = report.rows
                    self.videoURL = url
                    self.status = "Done"
                    self.running = false
                }
            } catch RuntimeError.cancelled {
                await MainActor.run { self.status = "Cancelled"; self.running = false }
            } catch {
                await MainActor.run { self.status = "Error: \(error)"; self.running = false }
            }
        }
    }
}
