/// A ``ConnectionPermit`` backed by a ``Role``: a ``ConnectionSupervisor`` connects only while
/// this process holds the role, closes its connection when a higher priority asks for it (after
/// critical sections end), and only then releases the lease.
///
/// ```swift
/// let role = try Role(container)
/// let supervisor = ConnectionSupervisor(container: container,
///                                       permit: RolePermit(role, priority: .executor, kind: "extension")) {
///     try await MyServerConnection.open()
/// }
/// ```
public struct RolePermit: ConnectionPermit {
    /// The role.
    public let role: Role
    /// The priority to acquire at.
    public let priority: RolePriority
    /// What this process is, shown in the role's status.
    public let kind: String

    /// Creates a permit.
    /// - Parameters:
    ///   - role: The role that gates the connection.
    ///   - priority: ``RolePriority/main`` for the app, ``RolePriority/executor`` for an extension.
    ///   - kind: What this process is (1 to 64 bytes).
    public init(_ role: Role, priority: RolePriority, kind: String = "process") {
        self.role = role
        self.priority = priority
        self.kind = kind
    }

    /// Acquires the role at this permit's priority.
    /// - Throws: As ``Role/acquire(priority:kind:deadline:)``: `busy`, `timedOut`, `suspended`;
    ///   `CancellationError` when the task is cancelled.
    public func acquire(deadline: Deadline) async throws -> any ConnectionGrant {
        RoleGrant(lease: try await role.acquire(priority: priority, kind: kind, deadline: deadline))
    }
}

/// A role lease as a ``ConnectionGrant``.
struct RoleGrant: ConnectionGrant {
    let lease: RoleLease

    /// Returns at the first stop request, or when the lease ended (overtaken, lost).
    func stopRequested() async throws {
        for await _ in lease.stopRequests { return }
        try Task.checkCancellation()
    }

    func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R {
        try await lease.withCriticalSection(body)
    }

    func release() async { await lease.release() }

    /// The process's signal thread, which receives the stop request.
    var stopRequestExecutor: (any TaskExecutor)? { try? lease.core.container.signals.executor }
}
