import Synchronization

/// A process-local counter that async tasks wait on: ``wait(after:)`` returns once the count has
/// moved past the value the waiter saw. Take a ``snapshot()`` before checking the condition you
/// wait for, so a change that lands in between is never missed.
///
/// The inbox uses it for what happens inside one process (a shared executor run starting or
/// ending, a message delivered by the source); signals carry what happens across processes.
final class ChangeCounter: Sendable {
    private struct State {
        var count: UInt64 = 0
        var nextID: UInt64 = 0
        var waiters: [UInt64: CheckedContinuation<Void, any Error>] = [:]
    }

    private let state = Mutex(State())

    init() {}

    /// The current count.
    func snapshot() -> UInt64 { state.withLock { $0.count } }

    /// Bumps the count and wakes every waiter.
    func bump() {
        let ready = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
            state.count &+= 1
            defer { state.waiters.removeAll(keepingCapacity: true) }
            return Array(state.waiters.values)
        }
        for continuation in ready { continuation.resume() }
    }

    /// Waits until the count differs from `seen`, or throws `CancellationError` when the task is
    /// cancelled. Deadlines are applied by the caller (see ``InboxWait``).
    func wait(after seen: UInt64) async throws {
        let id = state.withLock { state -> UInt64 in
            state.nextID &+= 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow = state.withLock { state -> (any Error)?? in
                    if Task.isCancelled { return .some(CancellationError()) }
                    if state.count != seen { return .some(nil) }
                    state.waiters[id] = continuation
                    return .none
                }
                switch resumeNow {
                case .none: break
                case .some(nil): continuation.resume()
                case .some(let error?): continuation.resume(throwing: error)
                }
            }
        } onCancel: {
            let continuation = state.withLock { $0.waiters.removeValue(forKey: id) }
            continuation?.resume(throwing: CancellationError())
        }
    }
}
