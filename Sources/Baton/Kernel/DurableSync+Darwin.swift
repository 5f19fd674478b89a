#if canImport(Darwin)
import CBatonShims

extension DurableSync {
    /// Flushes `fd` through the drive's cache (`F_FULLFSYNC`, or `fsync`).
    package static func sync(_ fd: Int32) -> Result<Void, SystemCallError> {
        Sys.retrying("fcntl(F_FULLFSYNC)") { baton_darwin_full_fsync(fd) }.map { _ in () }
    }

    /// Flushes a shared mapping of `fd`: `msync(MS_SYNC)` hands the pages to the file system,
    /// whose `fsync` leaves them in the drive's cache on Apple platforms, so `F_FULLFSYNC` follows.
    package static func sync(mapping pointer: UnsafeMutableRawPointer, size: Int, of fd: Int32) -> Result<Void, SystemCallError> {
        Sys.msync(pointer, size: size).flatMap { sync(fd) }
    }
}
#endif
