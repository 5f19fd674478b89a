import Baton

/// A `ConnectionPermit` backed by a `Role`: a `ConnectionSupervisor` connects only while this
/// process holds the role, and closes its connection before giving the role back when a higher
/// priority asks for it or the process suspends.
///
/// Baton's roles and lifecycle were built side by side and do not ship this adapter yet; it
/// belongs next to them (in `Baton`), and lives here until it moves.
public struct RoleConnectionPermit: ConnectionPermit {
    let role: Role
    let priority: RolePriority
    let kind: String
    /// Called with each grant's epoch when it is granted and when it is released (for the timeline).
    let onChange: @Sendable (_ epoch: UInt64, _ held: Bool) -> Void

    /// - Parameters:
    ///   - role: The role that allows connecting.
    ///   - priority: The priority to acquire it at (`.main` for the app).
    ///   - kind: What this process is, shown in the role's status.
    ///   - onChange: Called when a grant starts and ends.
    public init(role: Role, priority: RolePriority, kind: String, onChange: @escaping @Sendable (UInt64, Bool) -> Void = { _, _ in }) {
        self.role = role
        self.priority = priority
        self.kind = kind
        self.onChange = onChange
    }

    public func acquire(deadline: Deadline) async throws -> any ConnectionGrant {
        let lease = try await role.acquire(priority: priority, kind: kind, deadline: deadline)
        onChange(lease.epoch, true)
        return Grant(lease: lease, onChange: onChange)
    }

    struct Grant: ConnectionGrant {
        let lease: RoleLease
        let onChange: @Sendable (UInt64, Bool) -> Void

        func stopRequested() async throws {
            for await _ in lease.stopRequests { return }
            try Task.checkCancellation()
            // The sequence ended: the lease was released, overtaken or lost; stop as well.
        }

        func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R {
            try await lease.withCriticalSection(body)
        }

        func release() async {
            await lease.release()
            onChange(lease.epoch, false)
        }
    }
}
