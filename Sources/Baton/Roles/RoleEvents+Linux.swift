#if os(Linux)
import CBatonShims

extension FileEvents {
    /// What a role's directory is watched for: a descriptor opened for writing was closed. Every
    /// holder and waiter opens its lock file for writing, and the kernel closes it when the
    /// process dies, so this is "a holder or waiter may be gone". Liveness checks open files
    /// read-only, so they never wake anyone.
    static let roleDirectoryEvents: UInt32 = UInt32(IN_CLOSE_WRITE)
}
#endif
