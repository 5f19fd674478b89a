/// Wait on, and wake, a 32-bit word in memory that may be shared between processes (a file
/// mapped `MAP_SHARED` by several processes, or private memory): the kernel's futex on Linux,
/// `os_sync_wait_on_address` on Apple platforms (public since iOS 17.4 and macOS 14.4).
///
/// A waiter passes the value it saw; the kernel puts it to sleep only while the word still holds
/// that value, so a change made between the caller's check and its sleep is never missed. A wake
/// may be spurious: callers re-check their condition in a loop.
///
/// This is one primitive of the kernel layer (`Sources/Baton/Kernel`): the per-platform files
/// `AddressWait+Linux.swift` and `AddressWait+Darwin.swift` implement ``wait(on:expecting:timeoutNanoseconds:)``,
/// ``wakeOne(_:)`` and ``wakeAll(_:)``; nothing above this layer calls futex or os_sync directly.
package enum AddressWait {
    /// How a wait ended.
    package enum Outcome: Equatable, Sendable {
        /// Woken, or the word no longer held the expected value (possibly spuriously).
        case woken
        /// The timeout passed.
        case timedOut
    }
}
