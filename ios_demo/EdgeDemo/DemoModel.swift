import EdgeCore
import EdgeRuntime
import Foundation
import SwiftUI

/// Loads a package (bundled, or picked from Files) and runs generations off the main thread.
@MainActor
final class DemoModel: ObservableObject {
    @Published var prompt = "a red circle moving left"
    @Published var leap = false            // Linear Proportional Leap
    @Published var tdtm = false            // temporal token merging for the first half
    @Published var useBudget = false       // keep at most `budgetMB` of blocks loaded
    @Published var budgetMB = 64.0
    @Published var seed = 0
    @Published var progress = 0.0
    @Published var status = "No package loaded"
    @Published var videoURL: URL?
    @Published var timings: [(String, String)] = []
    @Published var running = false

    private var pipeline: EdgePipeline?
    private var packageURL: URL?
    private var loadedBudget: Int?

    /// The package bundled with the app (a folder reference named tiny-sora-iphone).
    func loadBundled() {
        guard let url = Bundle.main.url(forResource: "tiny-sora-iphone", withExtension: nil) else {
            status = "No bundled package: add tiny-sora-iphone to the app, or pick one from Files"
            return
        }
        packageURL = url
        status = "Package: \(url.lastPathComponent)"
        pipeline = nil
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
            pipeline = nil
            status = "Package: \(url.lastPathComponent)"
        } catch {
            status = "Cannot copy \(url.lastPathComponent): \(error.localizedDescription)"
        }
    }

    func generate() {
        guard let packageURL, !running else { return }
        running = true
        progress = 0
        status = "Verifying and loading…"
        let budget = useBudget ? Int(budgetMB * 1_000_000) : nil
        let (prompt, leap, tdtm, seed) = (self.prompt, self.leap, self.tdtm, UInt64(self.seed))
        let existing = loadedBudget == budget ? pipeline : nil
        Task.detached(priority: .userInitiated) {
            do {
                let started = Date()
                let pipe = try existing ?? EdgePipeline(package: packageURL, budget: budget)
                let loadSeconds = Date().timeIntervalSince(started)
                await MainActor.run { self.pipeline = pipe; self.loadedBudget = budget; self.status = "Generating…" }
                let result = try pipe.generate(prompt, seed: seed, configure: { s in
                    s.leap = leap
                    s.mergeSteps = tdtm ? s.steps / 2 : 0
                }, onStep: { done, total in
                    Task { @MainActor in self.progress = Double(done) / Double(total) }
                })
                let url = FileManager.default.temporaryDirectory.appendingPathComponent("edge-demo.mp4")
                try await VideoWriter.writeMP4(result.frames, width: result.width, height: result.height, to: url)
                let rows: [(String, Double)] = [("load + verify", loadSeconds)]
                    + ["text_encoder", "transformer", "vae_decoder", "total", "block_load_s"].compactMap { k in
                        result.timings[k].map { (k, $0) } }
                await MainActor.run {
                    self.timings = rows.map { ($0.0, String(format: "%.2f s", $0.1)) } + [
                        ("transformer calls", "\(result.trace.transformerCalls) of \(result.trace.calls)"),
                        ("merged (TDTM) calls", "\(result.trace.mergedCalls)"),
                        ("leap", result.trace.leapAt.map { "after step \($0)" } ?? "no")]
                    self.videoURL = url
                    self.status = "Done"
                    self.running = false
                }
            } catch {
                await MainActor.run { self.status = "Error: \(error)"; self.running = false }
            }
        }
    }
}
