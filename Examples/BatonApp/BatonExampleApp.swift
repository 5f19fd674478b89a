// A minimal SwiftUI app sharing a Baton container with its notification service extension.
// Not a SwiftPM target: add these files to an Xcode app target that has the App Group
// entitlement "group.com.example.baton". Type-checked by scripts/check-apple.sh.
import Baton
import Foundation
import SwiftUI

@main
struct BatonExampleApp: App {
    /// The shared container and its lifecycle, opened once per process.
    let lifecycle: AppLifecycle

    init() {
        do {
            lifecycle = AppLifecycle(container: try SharedStorage.openContainer())
        } catch {
            fatalError("cannot open the shared container: \(error)")
        }
    }

    var body: some Scene {
        WindowGroup {
            ContentView(lifecycle: lifecycle)
        }
    }
}

struct ContentView: View {
    let lifecycle: AppLifecycle

    var body: some View {
        // Suspends Baton (every lock, every database) when the scene goes to the background.
        Text("Baton is ready").batonLifecycle(lifecycle)
    }
}
