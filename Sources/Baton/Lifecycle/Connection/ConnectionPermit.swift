/// Permission to keep a connection: "may I connect now, and tell me when I must stop".
///
/// A ``ConnectionSupervisor`` connects only while it holds a ``ConnectionGrant``. With roles,
/// the permit is the role (the lease's stop requests end the grant); without them, use
/// ``UnrestrictedPermit`` or ``LocalConnectionPermit``.
public protocol ConnectionPermit: Sendable {
    /// Waits until the process may connect.
    /// - Parameter deadline: When to give up with `timedOut`.
    /// - Returns: The grant; give it back with ``ConnectionGrant/release()``.
    /// - Throws: `timedOut`, `suspended`, `busy`, `CancellationError`, or the permit's own errors.
    func acquire(deadline: Deadline) async throws -> any ConnectionGrant
}

/// Runs work that must not be interrupted by a stop request (a payment being sent).
public protocol CriticalSectionProvider: Sendable {
    /// Runs `body`; a stop request that arrives meanwhile waits until it returns.
    /// - Parameter body: The work.
    /// - Returns: What `body` returns.
    /// - Throws: What `body` throws, or the provider's own error (for example a lost role).
    func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R
}

/// One granted permission to connect (a role lease, for example).
public protocol ConnectionGrant: CriticalSectionProvider {
    /// Returns when the holder must stop (a higher priority asks, the grant was lost).
    /// - Throws: `CancellationError` when the calling task is cancelled first.
    func stopRequested() async throws

    /// Gives the permission back. The supervisor calls it only after its connection is closed.
    func release() async

    /// The executor of the thread that learns of a stop request first, or `nil` (the default)
    /// when there is none. The supervisor waits for the stop request on it, then closes its
    /// connection and releases the grant there, so that a hand-over wakes no second thread in
    /// this process. A role's grant (``RolePermit``) names the process's signal thread
    /// (``Signals/executor``): ``SupervisedConnection/close()`` then runs on that thread.
    var stopRequestExecutor: (any TaskExecutor)? { get }
}

extension ConnectionGrant {
    /// None: the supervisor waits for the stop request on its own executor.
    public var stopRequestExecutor: (any TaskExecutor)? { nil }
}

/// A permit that is always granted and never asks to stop: for a process that does not share
/// its connection with other processes.
public struct UnrestrictedPermit: ConnectionPermit {
    public init() {}

    public func acquire(deadline: Deadline) async throws -> any ConnectionGrant { Grant() }

    struct Grant: ConnectionGrant {
        func stopRequested() async throws {
            try await EventCounter().wait(after: 0, deadline: .never)
        }
        func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R {
            try await body()
        }
        func release() async {}
    }
}
