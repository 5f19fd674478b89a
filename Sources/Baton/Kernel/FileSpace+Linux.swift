#if os(Linux)
import CBatonShims

extension FileSpace {
    static let allocationCall = "posix_fallocate"

    /// `posix_fallocate` over the whole new length (glibc writes zeros where the file system has
    /// no `fallocate`). Returns 0 or an errno.
    static func allocate(_ fd: Int32, from current: Int, to size: Int) -> Int32 {
        var result: Int32
        repeat { result = posix_fallocate(fd, 0, off_t(size)) } while result == EINTR
        return result
    }
}
#endif
