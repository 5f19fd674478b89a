import CBatonShims
import Synchronization

/// A counter that async tasks can wait on: a wait returns once the count has moved past the value
/// the waiter saw. Kernel-wait threads (inotify, futex) call ``notify()``; nobody polls.
///
/// Take a ``snapshot()`` *before* checking the condition you wait for, then wait
/// `after:` that snapshot: a notification that lands in between is never lost.
package final class EventCounter: Sendable {
    private struct State {
        var count: UInt64 = 0
        var nextID: UInt64 = 0
        var waiters: [UInt64: (seen: UInt64, continuation: CheckedContinuation<Void, any Error>)] = [:]
    }

    private let state = Mutex(State())

    package init() {}

    /// The current count.
    package func snapshot() -> UInt64 { state.withLock { $0.count } }

    /// Bumps the count and wakes every waiter.
    package func notify() {
        let ready = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
            state.count &+= 1
            let resumed = state.waiters.values.map(\.continuation)
            state.waiters.removeAll(keepingCapacity: true)
            return resumed
        }
        for continuation in ready { continuation.resume() }
    }

    /// Waits until the count differs from `seen`, the deadline passes (throws `timedOut`), or the
    /// task is cancelled (throws `CancellationError`).
    package func wait(after seen: UInt64, deadline: Deadline) async throws {
        if let instant = deadline.instant, ContinuousClock.now >= instant {
            if snapshot() != seen { return }
            throw BatonError(.timedOut, "the deadline passed before the awaited event")
        }
        try await waitForNotification(after: seen, deadline: deadline.instant)
    }

    private func waitForNotification(after seen: UInt64, deadline: ContinuousClock.Instant?) async throws {
        let id = state.withLock { state -> UInt64 in
            state.nextID &+= 1
            return state.nextID
        }
        let timer = deadline.map { instant in
            DeadlineTimer.shared.schedule(at: instant) { [self] in
                let continuation = state.withLock { $0.waiters.removeValue(forKey: id)?.continuation }
                continuation?.resume(throwing: BatonError(.timedOut, "the deadline passed before the awaited event"))
            }
        }
        defer { if let timer { DeadlineTimer.shared.cancel(timer) } }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow = state.withLock { state -> (any Error)?? in
                    if Task.isCancelled { return .some(CancellationError()) }
                    if state.count != seen { return .some(nil) }
                    if let deadline, ContinuousClock.now >= deadline {
                        return .some(BatonError(.timedOut, "the deadline passed before the awaited event"))
                    }
                    state.waiters[id] = (seen, continuation)
                    return .none
                }
                switch resumeNow {
                case .none: break
                case .some(nil): continuation.resume()
                case .some(let error?): continuation.resume(throwing: error)
                }
            }
        } onCancel: {
            let continuation = state.withLock { $0.waiters.removeValue(forKey: id)?.continuation }
            continuation?.resume(throwing: CancellationError())
        }
    }
}
