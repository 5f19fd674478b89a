#if os(Linux)
import CBatonShims

extension DurableSync {
    /// Flushes the data of `fd` (and the metadata needed to read it back).
    package static func sync(_ fd: Int32) -> Result<Void, SystemCallError> {
        Sys.retrying("fdatasync") { fdatasync(fd) }.map { _ in () }
    }

    /// Flushes a shared mapping of `fd` (`msync(MS_SYNC)`, which on Linux writes the pages to
    /// the device like `fdatasync` does for the range).
    package static func sync(mapping pointer: UnsafeMutableRawPointer, size: Int, of fd: Int32) -> Result<Void, SystemCallError> {
        Sys.msync(pointer, size: size)
    }
}
#endif
