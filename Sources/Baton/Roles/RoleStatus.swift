#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A snapshot of a role: who holds it, in what state, and who waits.
public struct RoleStatus: Sendable, Codable, Hashable {
    /// What the holder is doing.
    public enum State: String, Sendable, Codable, Hashable {
        /// Holding the role normally.
        case running
        /// Asked to stop by a higher priority; expected to release within the grace period.
        case stopping
        /// Inside a critical section: requesters wait for it (bounded), so a UI can say
        /// "receiving in background".
        case critical
    }

    /// The process holding the role.
    public struct Holder: Sendable, Codable, Hashable {
        public var priority: RolePriority
        public var kind: String
        public var pid: Int32
        /// The fencing token of this grant.
        public var epoch: UInt64
        public var state: State
        /// When the role was granted.
        public var since: Date
        /// The pending stop request, if any.
        public var stopRequest: StopRequest?
    }

    /// A process waiting for the role.
    public struct Waiter: Sendable, Codable, Hashable {
        public var priority: RolePriority
        public var kind: String
        public var pid: Int32
        /// When it started waiting.
        public var since: Date
    }

    /// The role's name.
    public var name: String
    /// The live holder, or `nil` when the role is free (a holder that died or suspended itself
    /// holds no kernel lock and does not count).
    public var holder: Holder?
    /// Live waiters, highest priority first.
    public var waiters: [Waiter]
    /// The last epoch granted (0 before the first grant).
    public var epoch: UInt64
    /// The last time the record changed (grants, stop requests, critical sections, releases);
    /// for observers only: liveness comes from kernel locks.
    public var heartbeat: Date?
}
