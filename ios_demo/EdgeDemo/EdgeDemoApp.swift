import SwiftUI

@main
struct EdgeDemoApp: App {
    var body: some Scene {
        WindowGroup { ContentView() }
    }
}
