import CBatonShims

/// A grant whose validity can be checked at the moment of a shared write: a fencing token.
///
/// Roles' leases conform. Stores built on Baton (the shared database, shared defaults) check a
/// fence inside their own transaction and refuse the write with `fenced` when a newer holder
/// exists, so a process that was suspended, preempted or presumed dead can never overwrite
/// newer state.
public protocol Fence: Sendable {
    /// What the token fences (a role's name). Stores keep the highest epoch seen per scope.
    var scope: String { get }
    /// The epoch of this grant: monotonically increasing per scope, never reused.
    var epoch: UInt64 { get }
    /// Throws `fenced` (naming the current epoch) if this grant is no longer the current one.
    func validate() throws
}
