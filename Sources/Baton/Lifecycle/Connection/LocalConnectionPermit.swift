import Synchronization

/// A permit switched by the process itself: allow a connection, or withdraw it and wait until
/// the connection is closed (log-out, airplane-mode setting, tests).
///
/// One grant at a time. ``revoke(deadline:)`` asks the holder to stop and returns once it gave
/// the grant back, which a ``ConnectionSupervisor`` does only after closing its connection and
/// after every critical section (``SensitiveTasks``) ended.
public final class LocalConnectionPermit: ConnectionPermit {
    private struct State {
        var allowed: Bool
        var holder: UInt64?
        var nextID: UInt64 = 0
    }

    private let state: Mutex<State>
    private let changes = EventCounter()

    /// Creates a permit.
    /// - Parameter allowed: Whether connecting is allowed from the start.
    public init(allowed: Bool = true) {
        state = Mutex(State(allowed: allowed))
    }

    /// Whether connecting is allowed.
    public var isAllowed: Bool { state.withLock { $0.allowed } }

    /// Whether a grant is out (a supervisor holds it).
    public var isGranted: Bool { state.withLock { $0.holder != nil } }

    /// Allows connecting again.
    public func allow() {
        state.withLock { $0.allowed = true }
        changes.notify()
    }

    /// Withdraws the permission and waits until the current grant, if any, is released.
    /// - Parameter deadline: When to stop waiting with `timedOut` (the permission stays withdrawn).
    /// - Throws: `timedOut`, `CancellationError`.
    public func revoke(deadline: Deadline = .never) async throws {
        state.withLock { $0.allowed = false }
        changes.notify()
        while true {
            let seen = changes.snapshot()
            if state.withLock({ $0.holder == nil }) { return }
            try await changes.wait(after: seen, deadline: deadline)
        }
    }

    /// Waits until no other connection of this process holds the permit.
    /// - Throws: `timedOut` at the deadline; `CancellationError` when the task is cancelled.
    public func acquire(deadline: Deadline) async throws -> any ConnectionGrant {
        while true {
            let seen = changes.snapshot()
            let id = state.withLock { state -> UInt64? in
                guard state.allowed, state.holder == nil else { return nil }
                state.nextID += 1
                state.holder = state.nextID
                return state.nextID
            }
            if let id { return Grant(permit: self, id: id) }
            try await changes.wait(after: seen, deadline: deadline)
        }
    }

    private func mustStop(_ id: UInt64) -> Bool {
        state.withLock { !$0.allowed || $0.holder != id }
    }

    private func release(_ id: UInt64) {
        state.withLock { state in
            if state.holder == id { state.holder = nil }
        }
        changes.notify()
    }

    private struct Grant: ConnectionGrant {
        let permit: LocalConnectionPermit
        let id: UInt64

        func stopRequested() async throws {
            while true {
                let seen = permit.changes.snapshot()
                if permit.mustStop(id) { return }
                try await permit.changes.wait(after: seen, deadline: .never)
            }
        }

        func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R {
            try await body()
        }

        func release() async { permit.release(id) }
    }
}
