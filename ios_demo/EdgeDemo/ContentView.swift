import AVKit
import SwiftUI
import UniformTypeIdentifiers

struct ContentView: View {
    @StateObject private var model = DemoModel()
    @State private var picking = false

    var body: some View {
        NavigationStack {
            Form {
                Section("Package") {
                    Text(model.status).font(.footnote)
                    Button("Pick a package folder from Files") { picking = true }
                }
                Section("Prompt") {
                    TextField("a red circle moving left", text: $model.prompt)
                    Stepper("Seed \(model.seed)", value: $model.seed, in: 0...999)
                }
                Section("Speed-ups") {
                    Toggle("Step leaping (LPL)", isOn: $model.leap)
                    Toggle("Token merging (TDTM, first half)", isOn: $model.tdtm)
                    Toggle("Memory budget", isOn: $model.useBudget)
                    if model.useBudget {
                        Stepper("\(Int(model.budgetMiB)) MiB of blocks", value: $model.budgetMiB,
                                in: 32...512, step: 16)
                    }
                }
                Section {
                    if model.running {
                        Button("Cancel", role: .cancel) { model.cancel() }
                    } else {
                        Button("Generate") { model.generate() }
                    }
                    ProgressView(value: model.progress)
                }
                if let url = model.videoURL {
                    Section("Video") {
                        VideoPlayer(player: AVPlayer(url: url))
                            .aspectRatio(1, contentMode: .fit)
                    }
                }
                if !model.timings.isEmpty {
                    Section("Timings") {
                        ForEach(model.timings, id: \.0) { row in
                            LabeledContent(row.0, value: row.1)
                        }
                    }
                }
            }
            .navigationTitle("edge demo")
            .fileImporter(isPresented: $picking, allowedContentTypes: [.folder]) { result in
                if case .success(let url) = result { model.pick(url) }
            }
            .onAppear { model.loadBundled() }
        }
    }
}
