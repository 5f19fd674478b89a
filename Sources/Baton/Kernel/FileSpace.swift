/// Reserving disk space before a file grows, so that a full disk is reported as an error by the
/// call that grows the file (``BatonError/Code/noSpace``), never later as a `SIGBUS` when a write
/// through a memory mapping finds no block behind the page.
///
/// Kernel-layer primitive: `posix_fallocate` on Linux (`FileSpace+Linux.swift`);
/// `fcntl(F_PREALLOCATE)` then `ftruncate` on Apple platforms (`FileSpace+Darwin.swift`).
package enum FileSpace {
    /// Grows the file behind `fd` from `current` to `size` bytes with its blocks allocated (a
    /// file already as long is left alone). Throws `noSpace` when the volume is full; the file's
    /// existing bytes are unchanged either way.
    package static func reserve(_ fd: Int32, from current: Int, to size: Int, path: String) throws {
        guard size > current else { return }
        let code = allocate(fd, from: current, to: size)
        guard code != 0 else { return }
        let cause = SystemCallError(call: allocationCall, errno: code)
        if code == ENOSPC || code == EDQUOT || code == EFBIG {
            throw BatonError(.noSpace, "no space left to grow \(path) to \(size) bytes; free some space and retry (nothing was lost)", cause: cause)
        }
        throw BatonError.system(cause, "reserving \(size) bytes for \(path)")
    }
}
