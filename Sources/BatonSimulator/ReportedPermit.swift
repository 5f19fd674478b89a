import Baton

/// A `ConnectionPermit` that reports each grant to the simulator's timeline: it wraps Baton's
/// `RolePermit` and emits `role-acquired` and `role-released` with the role's epoch.
struct ReportedPermit: ConnectionPermit {
    let base: RolePermit
    let label: String

    init(_ base: RolePermit, label: String) {
        self.base = base
        self.label = label
    }

    func acquire(deadline: Deadline) async throws -> any ConnectionGrant {
        let grant = try await base.acquire(deadline: deadline)
        let epoch = (try? base.role.status().epoch) ?? 0
        ChildChannel.emit(.roleAcquired, epoch: epoch, detail: label)
        return Grant(base: grant, epoch: epoch, label: label)
    }

    struct Grant: ConnectionGrant {
        let base: any ConnectionGrant
        let epoch: UInt64
        let label: String

        func stopRequested() async throws { try await base.stopRequested() }

        func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R {
            try await base.withCriticalSection(body)
        }

        func release() async {
            await base.release()
            ChildChannel.emit(.roleReleased, epoch: epoch, detail: label)
        }
    }
}
