#if canImport(Darwin)
import CBatonShims

extension FileSpace {
    static let allocationCall = "fcntl(F_PREALLOCATE)"

    /// `F_PREALLOCATE` from the physical end of the file, then `ftruncate` (Apple platforms have
    /// no `posix_fallocate`). Returns 0 or an errno.
    static func allocate(_ fd: Int32, from current: Int, to size: Int) -> Int32 {
        baton_darwin_preallocate(fd, Int64(current), Int64(size))
    }
}
#endif
