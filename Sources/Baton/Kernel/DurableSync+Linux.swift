#if os(Linux)
import CBatonShims

extension DurableSync {
    /// Flushes the data of `fd` (and the metadata needed to read it back).
    package static func sync(_ fd: Int32) -> Result<Void, SystemCallError> {
        Sys.retrying("fdatasync") { fdatasync(fd) }.map { _ in () }
    }
}
#endif
