#if canImport(Darwin)
import CBatonShims

extension AddressWait {
    /// Sleeps while `word` holds `expected`, at most `timeoutNanoseconds` (< 0: no limit):
    /// `os_sync_wait_on_address(_with_timeout)` with `OS_SYNC_WAIT_ON_ADDRESS_SHARED`, which
    /// finds waiters of other processes that map the same memory (and works on private memory).
    @inline(__always)
    package static func wait(on word: UnsafeMutablePointer<UInt32>, expecting expected: UInt32, timeoutNanoseconds: Int64) -> Outcome {
        if baton_darwin_wait_on_address(word, expected, timeoutNanoseconds) == -1, baton_errno() == ETIMEDOUT { return .timedOut }
        return .woken
    }

    /// Wakes one waiter on `word` (`os_sync_wake_by_address_any`).
    @inline(__always)
    package static func wakeOne(_ word: UnsafeMutablePointer<UInt32>) { _ = baton_darwin_wake_by_address(word, 0) }

    /// Wakes every waiter on `word` (`os_sync_wake_by_address_all`).
    @inline(__always)
    package static func wakeAll(_ word: UnsafeMutablePointer<UInt32>) { _ = baton_darwin_wake_by_address(word, 1) }
}
#endif
