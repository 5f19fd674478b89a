#if canImport(UIKit)
import UIKit
import Synchronization

/// The iOS adapter: `UIApplication.beginBackgroundTask(withName:expirationHandler:)`.
///
/// The expiration handler calls Baton's handler (which cancels the sensitive work and expires
/// the container's suspension, releasing every lock) and then ends the platform task itself,
/// as iOS requires; the later ``endTask(_:)`` from ``SensitiveTasks`` is then a no-op. A task
/// begun when no background time is left (`.invalid`) is handled the same way.
///
/// Untested: this package's tests run on Linux.
public final class UIKitBackgroundTasks: BackgroundTaskProvider {
    private let ended = Mutex<Set<Int>>([])

    public init() {}

    public func beginTask(named name: String, onExpiration: @escaping @Sendable () -> Void) -> BackgroundTaskToken {
        let identifier = MainActor.assumeIsolatedOrHop {
            let box = IdentifierBox()
            let id = UIApplication.shared.beginBackgroundTask(withName: name) { [ended] in
                onExpiration()
                let raw = box.value.rawValue
                if ended.withLock({ $0.insert(raw).inserted }) { UIApplication.shared.endBackgroundTask(box.value) }
            }
            box.value = id
            return id
        }
        if identifier == .invalid { onExpiration() }
        return BackgroundTaskToken(rawValue: identifier.rawValue)
    }

    public func endTask(_ token: BackgroundTaskToken) {
        guard token.rawValue != UIBackgroundTaskIdentifier.invalid.rawValue else { return }
        guard ended.withLock({ $0.insert(token.rawValue).inserted }) else { return }
        let identifier = UIBackgroundTaskIdentifier(rawValue: token.rawValue)
        MainActor.assumeIsolatedOrHop { UIApplication.shared.endBackgroundTask(identifier) }
    }

    private final class IdentifierBox: @unchecked Sendable {
        // @unchecked: written once on the main actor before the handler can run (UIKit calls
        // the handler on the main thread), read on the main thread only.
        var value: UIBackgroundTaskIdentifier = .invalid
    }
}

extension MainActor {
    /// Runs `body` on the main actor, synchronously: directly when already there, else by a
    /// synchronous hop to the main queue (UIKit's background-task calls are main-thread API).
    fileprivate static func assumeIsolatedOrHop<T: Sendable>(_ body: @MainActor () -> T) -> T {
        if Thread.isMainThread { return MainActor.assumeIsolated(body) }
        return DispatchQueue.main.sync { MainActor.assumeIsolated(body) }
    }
}
#endif
