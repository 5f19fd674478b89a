#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A request, from a higher-priority process, that the holder of a role releases it.
public struct StopRequest: Sendable, Hashable, Codable {
    /// The priority of the process that asks.
    public var priority: RolePriority
    /// Its process id.
    public var pid: Int32
    /// When the grace period ends: past it (or past the requester's bound on critical sections,
    /// while the holder is inside one), the requester overtakes the role.
    public var deadline: Date

    public init(priority: RolePriority, pid: Int32, deadline: Date) {
        self.priority = priority
        self.pid = pid
        self.deadline = deadline
    }
}
