import Synchronization

/// Work that must not be cut short: a payment being sent, a message being delivered after the
/// user locked the phone.
///
/// While any sensitive task runs, the process keeps its role (a stop request waits, as for a
/// critical section) and the platform is asked for more time. Tasks nest and are counted.
/// When the platform says the time is up, the work is cancelled and the container is expired
/// (``SuspensionController/expire()``): every lock is released before the system freezes or
/// kills the process, and the task throws `expired`.
///
/// ```swift
/// let sensitive = SensitiveTasks(container: container, provider: UIKitBackgroundTasks(),
///                                criticalSection: supervisor)
/// try await sensitive.withSensitiveTask("send-payment") {
///     try await wallet.send(payment)
/// }
/// ```
public final class SensitiveTasks: Sendable {
    /// The container expired when the time runs out.
    public let container: SharedContainer
    /// The platform adapter.
    public let provider: any BackgroundTaskProvider
    private let criticalSection: (any CriticalSectionProvider)?
    private let state = Mutex<(nextID: UInt64, running: [UInt64: String])>((0, [:]))

    /// Creates the registry of sensitive tasks of one process.
    /// - Parameters:
    ///   - container: The shared container to expire when the platform's time runs out.
    ///   - provider: Asks the platform for time (iOS, simulator, in-process).
    ///   - criticalSection: What keeps the role while a task runs: a ``ConnectionSupervisor``
    ///     (which uses its grant's critical section) or a role lease; `nil` for none.
    public init(
        container: SharedContainer,
        provider: any BackgroundTaskProvider,
        criticalSection: (any CriticalSectionProvider)? = nil
    ) {
        self.container = container
        self.provider = provider
        self.criticalSection = criticalSection
    }

    /// The names of the sensitive tasks running now (nested ones included).
    public var running: [String] { state.withLock { $0.running.values.sorted() } }

    /// Whether any sensitive task runs.
    public var isBusy: Bool { state.withLock { !$0.running.isEmpty } }

    private enum Outcome<R: Sendable>: Sendable {
        case finished(R)
        case expired
    }

    /// Runs `body` as a sensitive task.
    /// - Parameters:
    ///   - name: A short name for debugging (1 to 255 bytes, shown by the platform's tools).
    ///   - body: The work. It is cancelled if the time runs out.
    /// - Returns: What `body` returns.
    /// - Throws: `expired` when the platform's time ran out first (the container is then
    ///   expired and holds no lock); `expired` at once if the container already expired;
    ///   `invalidName`; what `body` throws.
    public func withSensitiveTask<R: Sendable>(
        _ name: String,
        _ body: @escaping @Sendable () async throws -> R
    ) async throws -> R {
        guard !name.isEmpty, name.utf8.count <= 255 else {
            throw BatonError(.invalidName, "a sensitive task name must be 1 to 255 bytes of UTF-8")
        }
        if container.suspension.isExpired {
            throw BatonError(.expired, "cannot begin sensitive task \(name): the process's background time already ran out; begin it again when the app is active")
        }
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            state.running[state.nextID] = name
            return state.nextID
        }
        defer { _ = state.withLock { $0.running.removeValue(forKey: id) } }

        let expiration = EventCounter()
        let seen = expiration.snapshot()
        let token = provider.beginTask(named: name) { expiration.notify() }
        // Ended exactly once, whatever happens below: also after expiry, and for a task begun
        // when the process was already out of time.
        defer { provider.endTask(token) }

        let container = self.container
        let guarded: @Sendable () async throws -> R = {
            let outcome = try await withThrowingTaskGroup(of: Outcome<R>.self) { group in
                group.addTask { .finished(try await body()) }
                group.addTask {
                    try await expiration.wait(after: seen, deadline: .never)
                    return .expired
                }
                defer { group.cancelAll() }
                let first = try await group.next() ?? .expired
                if case .expired = first {
                    // Release every lock first; the work is cancelled by the group's exit.
                    await container.suspension.expire()
                }
                return first
            }
            switch outcome {
            case .finished(let value): return value
            case .expired:
                throw BatonError(.expired, "the system ended the background time of sensitive task \(name); its work was cancelled and every lock released. Retry when the app is active again")
            }
        }
        if let criticalSection { return try await criticalSection.withCriticalSection(guarded) }
        return try await guarded()
    }
}
