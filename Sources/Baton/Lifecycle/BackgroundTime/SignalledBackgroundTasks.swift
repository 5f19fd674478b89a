/// A ``BackgroundTaskProvider`` for Linux (and simulators): another process says "time is up"
/// by posting the Baton signal ``signalName(pid:)`` in the shared container, as the iOS
/// system would call the expiration handler. `baton lifecycle expire --pid N` posts it.
///
/// Run ``run()`` as a service for as long as the process may receive expirations.
public final class SignalledBackgroundTasks: BackgroundTaskProvider {
    private let local = LocalBackgroundTasks()
    private let observation: SignalObservation
    /// The signal this process listens to.
    public let signalName: String

    /// The signal that expires the background time of process `pid`.
    public static func signalName(pid: Int32) -> String { "baton.lifecycle.expire.\(pid)" }

    /// Starts listening (observation begins now, so no expiry posted after this is lost).
    /// - Parameter container: The shared container whose signals carry the expiry.
    /// - Throws: Errors of ``Signals/observe(_:)``.
    public init(container: SharedContainer) throws {
        signalName = Self.signalName(pid: getpid())
        observation = try container.signals.observe(signalName)
    }

    /// The names of the tasks begun and not ended yet.
    public var activeTasks: [String] { local.activeTasks }
    /// Whether an expiry was received (and not renewed).
    public var isExpired: Bool { local.isExpired }

    public func beginTask(named name: String, onExpiration: @escaping @Sendable () -> Void) -> BackgroundTaskToken {
        local.beginTask(named: name, onExpiration: onExpiration)
    }

    public func endTask(_ token: BackgroundTaskToken) { local.endTask(token) }

    /// Grants time again (the simulated process came back to the foreground).
    public func renew() { local.renew() }

    /// Delivers expiries until the task is cancelled.
    /// - Throws: Nothing but cancellation-related errors of the underlying wait.
    public func run() async throws {
        while !Task.isCancelled {
            do {
                _ = try await observation.next(deadline: .never)
            } catch is CancellationError {
                return
            }
            local.expire()
        }
    }
}
