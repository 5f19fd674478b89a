#if canImport(UIKit)
import Foundation
import UIKit

extension AppLifecycle {
    /// Follows the app's lifecycle through UIKit's notifications: the application's (and each
    /// scene's) did-enter-background and will-enter-foreground. Works with an app delegate, a
    /// scene delegate, or both; call once at launch and keep the returned observation.
    ///
    /// Not for app extensions, which have no application lifecycle: a notification service
    /// extension calls ``extensionWillHandleRequest()`` and ``extensionTimeWillExpire()``.
    ///
    /// Background time that runs out ends in ``backgroundTimeWillExpire()`` when the task was
    /// begun through ``UIKitBackgroundTasks`` and ``SensitiveTasks`` (which expire the container).
    @available(iOSApplicationExtension, unavailable)
    @MainActor
    public func observeApplicationLifecycle(center: NotificationCenter = .default) -> ApplicationLifecycleObservation {
        let names: [(Notification.Name, Phase)] = [
            (UIApplication.didEnterBackgroundNotification, .background),
            (UIScene.didEnterBackgroundNotification, .background),
            (UIApplication.willEnterForegroundNotification, .inactive),
            (UIScene.willEnterForegroundNotification, .inactive),
        ]
        let application = UIApplication.shared
        let tokens = names.map { name, phase in
            center.addObserver(forName: name, object: nil, queue: .main) { [self] _ in
                // A background task keeps the app running until the locks are released.
                let task = application.beginBackgroundTask(withName: "baton.lifecycle", expirationHandler: nil)
                Task {
                    await self.phaseChanged(to: phase)
                    if task != .invalid { application.endBackgroundTask(task) }
                }
            }
        }
        return ApplicationLifecycleObservation(center: center, tokens: tokens)
    }

    /// Call from `applicationDidEnterBackground(_:)` or `sceneDidEnterBackground(_:)` when you
    /// drive the lifecycle by hand instead of ``observeApplicationLifecycle(center:)``.
    @available(iOSApplicationExtension, unavailable)
    @MainActor
    public func didEnterBackground(_ application: UIApplication) {
        let task = application.beginBackgroundTask(withName: "baton.suspend", expirationHandler: nil)
        Task {
            await phaseChanged(to: .background)
            if task != .invalid { application.endBackgroundTask(task) }
        }
    }

    /// Call from `applicationWillEnterForeground(_:)` or `sceneWillEnterForeground(_:)`.
    @available(iOSApplicationExtension, unavailable)
    @MainActor
    public func willEnterForeground(_ application: UIApplication) {
        Task { await phaseChanged(to: .inactive) }
    }
}

/// Keeps ``AppLifecycle/observeApplicationLifecycle(center:)`` running; ``cancel()`` stops it.
@available(iOSApplicationExtension, unavailable)
public final class ApplicationLifecycleObservation: @unchecked Sendable {
    // @unchecked: the tokens are set once in init and only read by cancel(); NotificationCenter
    // is thread-safe.
    private let center: NotificationCenter
    private let tokens: [any NSObjectProtocol]

    init(center: NotificationCenter, tokens: [any NSObjectProtocol]) {
        self.center = center
        self.tokens = tokens
    }

    /// Stops observing.
    public func cancel() { for token in tokens { center.removeObserver(token) } }

    deinit { cancel() }
}
#endif
