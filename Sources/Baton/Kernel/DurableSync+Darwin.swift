#if canImport(Darwin)
import CBatonShims

extension DurableSync {
    /// Flushes `fd` through the drive's cache (`F_FULLFSYNC`, or `fsync`).
    package static func sync(_ fd: Int32) -> Result<Void, SystemCallError> {
        Sys.retrying("fcntl(F_FULLFSYNC)") { baton_darwin_full_fsync(fd) }.map { _ in () }
    }
}
#endif
