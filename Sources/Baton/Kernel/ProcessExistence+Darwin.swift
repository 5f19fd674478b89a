#if canImport(Darwin)
import CBatonShims

extension ProcessExistence {
    /// `true` only when `kill(pid, 0)` fails with `ESRCH` (no such process). The sandbox may
    /// answer `EPERM` for another app's process: that counts as "exists" (see the type's docs).
    package static func isCertainlyGone(_ pid: Int32) -> Bool {
        guard case .failure(let error) = Sys.kill(pid, 0) else { return false }
        return error.errno == ESRCH
    }
}
#endif
