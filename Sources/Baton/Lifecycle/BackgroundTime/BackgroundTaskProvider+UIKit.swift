#if canImport(UIKit)
import Dispatch
import Foundation
import Synchronization
import UIKit

/// The iOS adapter: `UIApplication.beginBackgroundTask(withName:expirationHandler:)`.
///
/// The expiration handler calls Baton's handler (which cancels the sensitive work and expires
/// the container's suspension, releasing every lock) and then ends the platform task itself,
/// as iOS requires; the later ``endTask(_:)`` from ``SensitiveTasks`` is then a no-op. A task
/// begun when no background time is left (`.invalid`) is handled the same way.
///
/// App extensions have no `UIApplication.shared`: create this adapter with the application
/// object in the app (``init(application:)``), or use ``init()`` in the app only. In an
/// extension, use ``LocalBackgroundTasks`` instead.
///
/// Type-checked against UIKit's declarations (scripts/check-apple.sh); not run here.
public final class UIKitBackgroundTasks: BackgroundTaskProvider {
    private let state = State()
    /// Main-actor isolated (so `Sendable`); the two calls used here are `nonisolated` in UIKit.
    private let application: UIApplication

    /// Uses the given application object (the app's `UIApplication.shared`).
    public init(application: UIApplication) {
        self.application = application
    }

    /// Uses `UIApplication.shared`. Not available in app extensions.
    @available(iOSApplicationExtension, unavailable)
    @MainActor
    public convenience init() {
        self.init(application: UIApplication.shared)
    }

    public func beginTask(named name: String, onExpiration: @escaping @Sendable () -> Void) -> BackgroundTaskToken {
        let state = self.state
        let application = self.application
        let box = IdentifierBox()
        let identifier = application.beginBackgroundTask(withName: name) {
            onExpiration()
            let raw = box.value.rawValue
            if state.markEnded(raw) { application.endBackgroundTask(box.value) }
        }
        box.value = identifier
        if identifier == .invalid { onExpiration() }
        return BackgroundTaskToken(rawValue: identifier.rawValue)
    }

    public func endTask(_ token: BackgroundTaskToken) {
        guard token.rawValue != UIBackgroundTaskIdentifier.invalid.rawValue else { return }
        guard state.markEnded(token.rawValue) else { return }
        application.endBackgroundTask(UIBackgroundTaskIdentifier(rawValue: token.rawValue))
    }

    /// The identifiers already ended, behind a lock. A class, so closures capture a reference
    /// (a `Mutex` is non-copyable and cannot be captured by value).
    private final class State: Sendable {
        private let ended = Mutex<Set<Int>>([])
        /// Records `raw` as ended; false when it already was.
        func markEnded(_ raw: Int) -> Bool { ended.withLock { $0.insert(raw).inserted } }
    }

    private final class IdentifierBox: @unchecked Sendable {
        // @unchecked: written once right after beginBackgroundTask returns; UIKit calls the
        // expiration handler on the main thread later, after the app returned to the run loop.
        var value: UIBackgroundTaskIdentifier = .invalid
    }
}
#endif
