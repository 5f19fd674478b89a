import Synchronization

/// Lets one test at a time park a thread of Swift's cooperative pool (a database write whose
/// body spins or loops until the test's own task acts).
///
/// The pool has one thread per core: on a 2-core machine, two such tests running at once park
/// both threads and neither test's task can run to release its own (a hang of the whole run).
/// Tests that park a pool thread take this gate around that part.
package enum PoolThreadGate {
    private static let state = Mutex<(busy: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    /// Runs `body` while no other test holds the gate.
    package static func exclusive<T: Sendable>(_ body: () async throws -> T) async rethrows -> T {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                if state.busy {
                    state.waiters.append(continuation)
                    return false
                }
                state.busy = true
                return true
            }
            if now { continuation.resume() }
        }
        defer {
            let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
                if state.waiters.isEmpty {
                    state.busy = false
                    return nil
                }
                return state.waiters.removeFirst()
            }
            next?.resume()
        }
        return try await body()
    }
}
