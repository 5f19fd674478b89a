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
///
/// The descriptor has one owner at a time, so it is closed exactly once: this object while the
/// thread waits, then the caller once granted (``wait(until:)`` and ``value(until:)`` hand it
/// over), or the thread when the `flock` failed or the wait was abandoned.
final class ArbiterWait: Sendable {
    private enum Phase {
        case waiting
        case granted
        case failed(SystemCallError)
        case abandoned
        /// Granted, and the descriptor handed to the caller.
        case taken
    }

    private struct State: ~Copyable {
        var phase = Phase.waiting
        /// The descriptor the thread locks, while this object owns it.
        var descriptor: FileDescriptor?
    }

    private let state: Mutex<State>
    /// Signalled (sync waiters) and notified (async waiters) when the thread's `flock` returns.
    private let granted = DispatchSemaphore(value: 0)
    private let finished = EventCounter()

    /// Starts waiting for `operation` (`LOCK_EX` or `LOCK_SH`) on `descriptor`, opened for this
    /// wait alone; `bell` is rung when an abandoned wait lets go of the lock it got too late.
    init(_ descriptor: consuming FileDescriptor, operation: Int32, bell: ArbiterBell) {
        // Borrowed by the thread: nobody closes the descriptor while its `flock` may block (an
        // abandoned wait leaves it to the thread).
        let fd = descriptor.rawValue
        state = Mutex(State(descriptor: descriptor))
        KernelThread.spawn(name: "baton-arbiter") { [self] in
            let result = Sys.flock(fd, operation)
            var decided = false
            let release = state.withLock { state -> FileDescriptor? in
                switch (state.phase, result) {
                case (.waiting, .success):
                    state.phase = .granted
                    decided = true
                    return nil
                case (.waiting, .failure(let error)):
                    state.phase = .failed(error)
                    decided = true
                    return state.descriptor.take()
                default: // abandoned meanwhile: the lock came too late
                    return state.descriptor.take()
                }
            }
            release?.unlockAndClose()
            // An abandoned wait that got the lock has just let go of it: watchers may wait.
            if !decided, case .success = result { bell.ring() }
            if decided {
                granted.signal()
                finished.notify()
            }
        }
    }

    /// Waits until the lock is granted or `deadline` passes.
    /// - Returns: The descriptor that holds the lock (unlock and close it after use), or `nil`
    ///   at the deadline.
    /// - Throws: The `flock` failure, if it failed.
    func wait(until deadline: Deadline) throws -> FileDescriptor? {
        let timeout: DispatchTime = deadline.remaining.map { .now() + .nanoseconds(Int(clamping: $0.nanoseconds)) } ?? .distantFuture
        _ = granted.wait(timeout: timeout)
        return try outcome()
    }

    /// Like ``wait(until:)``, suspending the task instead of blocking its thread.
    /// - Throws: Also `CancellationError` when the task is cancelled (the wait is abandoned).
    func value(until deadline: Deadline) async throws -> FileDescriptor? {
        do {
            try await finished.wait(after: 0, deadline: deadline)
        } catch let error as BatonError where error.code == .timedOut {
            // Decided below: the lock may have come at the last instant.
        } catch {
            try outcome()?.unlockAndClose()
            throw error
        }
        return try outcome()
    }

    /// The lock's descriptor when granted (handed over once); otherwise the wait is abandoned
    /// and `nil` returned.
    private func outcome() throws -> FileDescriptor? {
        var failure: SystemCallError?
        let descriptor = state.withLock { state -> FileDescriptor? in
            switch state.phase {
            case .granted:
                state.phase = .taken
                return state.descriptor.take()
            case .failed(let error):
                failure = error
                return nil
            case .waiting:
                state.phase = .abandoned
                return nil
            case .abandoned, .taken:
                return nil
            }
        }
        if let failure { throw BatonError.system(failure, "waiting for a role's arbiter lock") }
        return descriptor
    }
}
