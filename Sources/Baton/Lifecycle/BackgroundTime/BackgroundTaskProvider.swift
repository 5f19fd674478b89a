/// The platform's way to ask for more time while important work runs: on iOS
/// `UIApplication.beginBackgroundTask(withName:expirationHandler:)`; on Linux an adapter that a
/// simulator or supervisor drives (``SignalledBackgroundTasks``), or ``LocalBackgroundTasks``.
///
/// ``SensitiveTasks`` calls ``beginTask(named:onExpiration:)`` once per sensitive task and
/// ``endTask(_:)`` exactly once for each begin, whatever happened (expiry, error, cancellation,
/// a task begun when no time was left).
public protocol BackgroundTaskProvider: Sendable {
    /// Asks for time to finish the task.
    /// - Parameters:
    ///   - name: A name for debugging (shown by the platform's tools).
    ///   - onExpiration: Called (at most once, on any thread) when the time is up. It may be
    ///     called before `beginTask` returns when no time is left.
    /// - Returns: A token for ``endTask(_:)``.
    func beginTask(named name: String, onExpiration: @escaping @Sendable () -> Void) -> BackgroundTaskToken

    /// Tells the platform the task is over. Called exactly once per token, also after expiry.
    func endTask(_ token: BackgroundTaskToken)
}

/// Identifies one begun background task.
public struct BackgroundTaskToken: Sendable, Hashable {
    /// The provider's identifier (on iOS the `UIBackgroundTaskIdentifier`'s raw value).
    public let rawValue: Int

    /// Creates a token.
    public init(rawValue: Int) { self.rawValue = rawValue }
}
