#if canImport(SwiftUI)
import SwiftUI

extension View {
    /// Suspends Baton when the scene phase becomes `.background` and resumes it on `.inactive`
    /// or `.active`: apply once, to the root view of the app's `WindowGroup`.
    ///
    /// ```swift
    /// WindowGroup { ContentView().batonLifecycle(lifecycle) }
    /// ```
    @MainActor
    public func batonLifecycle(_ lifecycle: AppLifecycle) -> some View {
        modifier(BatonLifecycleModifier(lifecycle: lifecycle))
    }
}

private struct BatonLifecycleModifier: ViewModifier {
    let lifecycle: AppLifecycle
    @Environment(\.scenePhase) private var scenePhase

    func body(content: Content) -> some View {
        content.onChange(of: scenePhase, initial: true) { _, phase in
            let mapped: AppLifecycle.Phase = switch phase {
            case .background: .background
            case .inactive: .inactive
            default: .active
            }
            Task { await lifecycle.phaseChanged(to: mapped) }
        }
    }
}
#endif
