#if os(Linux)
import CBatonShims

extension AddressWait {
    /// Sleeps while `word` holds `expected`, at most `timeoutNanoseconds` (< 0: no limit).
    /// `FUTEX_WAIT` without `FUTEX_PRIVATE_FLAG`, so waiters in other processes that map the same
    /// file page are found.
    @inline(__always)
    package static func wait(on word: UnsafeMutablePointer<UInt32>, expecting expected: UInt32, timeoutNanoseconds: Int64) -> Outcome {
        if baton_linux_futex_wait(word, expected, timeoutNanoseconds) == -1, baton_errno() == ETIMEDOUT { return .timedOut }
        return .woken
    }

    /// Wakes one waiter on `word`.
    @inline(__always)
    package static func wakeOne(_ word: UnsafeMutablePointer<UInt32>) { _ = baton_linux_futex_wake(word, 1) }

    /// Wakes every waiter on `word`.
    @inline(__always)
    package static func wakeAll(_ word: UnsafeMutablePointer<UInt32>) { _ = baton_linux_futex_wake(word, Int32.max) }
}
#endif
