#if canImport(Darwin)
import CBatonShims
import Darwin

/// Apple has no `fdatasync`. `fsync(2)` there only hands the data to the drive, whose cache may
/// still lose it on power failure; `fcntl(F_FULLFSYNC)` also flushes the drive, which is what
/// `fdatasync` gives on Linux, so Baton uses it, and falls back to `fsync` on file systems
/// that refuse it (as SQLite does).
@inline(__always) func libc_fdatasync(_ fd: Int32) -> Int32 {
    if baton_fcntl_int(fd, F_FULLFSYNC, 0) == 0 { return 0 }
    return fsync(fd)
}
#endif
