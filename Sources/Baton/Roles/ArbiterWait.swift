import CBatonShims
import Dispatch
import Synchronization

/// A wait with a deadline for a role's arbiter lock while another process holds it.
///
/// A transition holds the arbiter for microseconds, so a wait happens only when the holder is
/// stopped, hung, or not Baton at all; `flock(2)` itself has no timeout. The blocking `flock`
/// runs on a thread of its own, on a descriptor of its own, and the caller sleeps until that
/// thread has the lock or the deadline passes: a synchronous caller in the kernel on a
/// semaphore, an async one suspended on an ``EventCounter``. At the deadline the
/// caller gives up; the thread stays blocked until the holder lets go, then releases the lock at
/// once and closes its descriptor (one thread per abandoned wait, only while a holder is stuck).
final class ArbiterWait: Sendable {
    private enum Phase {
        case waiting
        case granted
        case failed(SystemCallError)
        case abandoned
    }

    private let phase = Mutex(Phase.waiting)
    /// Signalled (sync waiters) and notified (async waiters) when the thread's `flock` returns.
    private let granted = DispatchSemaphore(value: 0)
    private let finished = EventCounter()
    /// The descriptor the thread locks; it belongs to the caller once granted.
    private let fd: Int32

    /// Starts waiting for `operation` (`LOCK_EX` or `LOCK_SH`) on `fd`, a descriptor opened for
    /// this wait alone (it is closed by this object unless the lock is granted).
    init(fd: Int32, operation: Int32) {
        self.fd = fd
        KernelThread.spawn(name: "baton-arbiter") { [self] in
            let result = Sys.flock(fd, operation)
            let abandoned = phase.withLock { phase -> Bool in
                guard case .waiting = phase else { return true }
                switch result {
                case .success: phase = .granted
                case .failure(let error): phase = .failed(error)
                }
                return false
            }
            if abandoned {
                Sys.unlockAndClose(fd)
            } else {
                granted.signal()
                finished.notify()
            }
        }
    }

    /// Waits until the lock is granted or `deadline` passes.
    /// - Returns: The descriptor that holds the lock (unlock and close it after use), or `nil`
    ///   at the deadline.
    /// - Throws: The `flock` failure, if it failed.
    func wait(until deadline: Deadline) throws -> Int32? {
        let timeout: DispatchTime = deadline.remaining.map { .now() + .nanoseconds(Int(clamping: $0.nanoseconds)) } ?? .distantFuture
        _ = granted.wait(timeout: timeout)
        return try outcome()
    }

    /// Like ``wait(until:)``, suspending the task instead of blocking its thread.
    /// - Throws: Also `CancellationError` when the task is cancelled (the wait is abandoned).
    func value(until deadline: Deadline) async throws -> Int32? {
        do {
            try await finished.wait(after: 0, deadline: deadline)
        } catch let error as BatonError where error.code == .timedOut {
            // Decided below: the lock may have come at the last instant.
        } catch {
            if try outcome() != nil { Sys.unlockAndClose(fd) }
            throw error
        }
        return try outcome()
    }

    /// The lock's descriptor when granted; otherwise the wait is abandoned and `nil` returned.
    private func outcome() throws -> Int32? {
        let outcome = phase.withLock { phase -> Result<Int32?, SystemCallError> in
            switch phase {
            case .granted: return .success(fd)
            case .failed(let error): return .failure(error)
            case .waiting, .abandoned:
                phase = .abandoned
                return .success(nil)
            }
        }
        if case .failure = outcome { Sys.close(fd) }
        return try outcome.get("waiting for a role's arbiter lock")
    }
}
