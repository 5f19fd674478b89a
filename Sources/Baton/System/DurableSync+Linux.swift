#if os(Linux)
import CBatonShims

/// `fdatasync(2)`: the file's data and the metadata needed to read it back, flushed through
/// the device's write cache.
@inline(__always) func libc_fdatasync(_ fd: Int32) -> Int32 { fdatasync(fd) }
#endif
