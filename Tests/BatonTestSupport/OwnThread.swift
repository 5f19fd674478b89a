import Foundation

/// Runs a blocking call (a `TicketLock.acquire`, a `DispatchSemaphore.wait`, a plain SQLite
/// connection holding its lock) on a thread of its own and returns its result.
///
/// Swift's cooperative pool has one thread per core. A test that blocks a pool thread for
/// seconds leaves, on a 2-core runner where other suites run at once, no thread for its own
/// task: the step that should end the wait (a SIGKILL, a release) runs only after the blocking
/// call has timed out. A blocking call made through this function parks no pool thread.
package func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
        let thread = Thread { continuation.resume(with: Result { try body() }) }
        thread.name = "test-blocking-call"
        thread.start()
    }
}
