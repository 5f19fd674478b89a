#if os(Linux)
import CBatonShims

extension ProcessExistence {
    /// `true` only when `kill(pid, 0)` fails with `ESRCH` (no such process).
    package static func isCertainlyGone(_ pid: Int32) -> Bool {
        guard case .failure(let error) = Sys.kill(pid, 0) else { return false }
        return error.errno == ESRCH
    }
}
#endif
