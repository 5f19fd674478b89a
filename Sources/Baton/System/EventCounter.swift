import CBatonShims
import Synchronization

/// A counter that async tasks can wait on: a wait returns once the count has moved past the value
/// the waiter saw. Kernel-wait threads (inotify, futex) call ``notify()``; nobody polls.
///
/// Take a ``snapshot()`` *before* checking the condition you wait for, then wait
/// `after:` that snapshot: a notification that lands in between is never lost.
///
/// ``waitAny(_:deadline:)`` waits on several counters with one continuation: no task group, no
/// child task per source, so the thread that notifies resumes the waiter directly.
package final class EventCounter: Sendable {
    private struct State {
        var count: UInt64 = 0
        /// The waiters, the first one inline: nearly every counter has one waiter at a time (an
        /// observation's task), and a notification then moves it out without a hash table, a
        /// hash or an array.
        var first: Waiter?
        var others: [Waiter] = []

        mutating func add(_ waiter: Waiter) {
            if first == nil { first = waiter } else { others.append(waiter) }
        }

        mutating func remove(_ id: UInt64) -> Wake? {
            if let waiter = first, waiter.id == id {
                first = nil
                return waiter.wake
            }
            guard let index = others.firstIndex(where: { $0.id == id }) else { return nil }
            return others.remove(at: index).wake
        }
    }

    private struct Waiter {
        var id: UInt64
        var wake: Wake
    }

    /// What a registered waiter resumes: its own continuation, or one source of a shared wait.
    ///
    /// Unsafe continuations, as in swift-async-algorithms' state machines: each is taken out of
    /// the state under the lock that registered it, so it is resumed once. A
    /// `CheckedContinuation` is a resilient type of the Concurrency library, whose every copy
    /// and destruction goes through its type metadata: measured with callgrind, a delivery on
    /// the signal thread spent about 1,200 of its 9,000 instructions there.
    private enum Wake {
        case single(UnsafeContinuation<Void, any Error>)
        case shared(SharedWait, index: Int)

        func resume() {
            switch self {
            case .single(let continuation): continuation.resume()
            case .shared(let wait, let index): wait.finish(.success(index))
            }
        }
    }

    private let state = Mutex(State())
    /// Waiter ids, unique across every counter of the process (a shared wait registers one id
    /// with each of its counters).
    private static let nextID = Atomic<UInt64>(0)

    package init() {}

    /// The current count.
    package func snapshot() -> UInt64 { state.withLock { $0.count } }

    /// Bumps the count and wakes every waiter.
    package func notify() {
        let (first, others) = state.withLock { state -> (Wake?, [Waiter]) in
            state.count &+= 1
            defer { (state.first, state.others) = (nil, []) }
            return (state.first?.wake, state.others)
        }
        first?.resume()
        for waiter in others { waiter.wake.resume() }
    }

    /// Waits until the count differs from `seen`, the deadline passes (throws `timedOut`), or the
    /// task is cancelled (throws `CancellationError`).
    ///
    /// The waits run on the caller's executor (`nonisolated(nonsending)`), as do the waits built
    /// on them (signal observations, the defaults' and the database's watches): a hop to the
    /// generic executor and back costs a task that prefers an executor (``Signals/executor``)
    /// a look-up of that preference in the runtime, under a lock, each way.
    nonisolated(nonsending) package func wait(after seen: UInt64, deadline: Deadline) async throws {
        if deadline.hasPassed {
            if snapshot() != seen { return }
            throw Self.timedOut
        }
        try await waitForNotification(after: seen, deadline: deadline)
    }

    private static var timedOut: BatonError { BatonError(.timedOut, "the deadline passed before the awaited event") }

    private func removeWaiter(_ id: UInt64) -> Wake? {
        state.withLock { $0.remove(id) }
    }

    nonisolated(nonsending) private func waitForNotification(after seen: UInt64, deadline: Deadline) async throws {
        let id = Self.nextID.add(1, ordering: .relaxed).newValue
        let timer = deadline.time.map { time in
            DeadlineTimer.shared.schedule(atTime: time) { [self] in
                if case .single(let continuation)? = removeWaiter(id) { continuation.resume(throwing: Self.timedOut) }
            }
        }
        defer { if let timer { DeadlineTimer.shared.cancel(timer) } }
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Void, any Error>) in
                let resumeNow = state.withLock { state -> (any Error)?? in
                    if Task.isCancelled { return .some(CancellationError()) }
                    if state.count != seen { return .some(nil) }
                    if deadline.hasPassed { return .some(Self.timedOut) }
                    state.add(Waiter(id: id, wake: .single(continuation)))
                    return .none
                }
                switch resumeNow {
                case .none: break
                case .some(nil): continuation.resume()
                case .some(let error?): continuation.resume(throwing: error)
                }
            }
        } onCancel: {
            if case .single(let continuation)? = removeWaiter(id) { continuation.resume(throwing: CancellationError()) }
        }
    }

    // MARK: Waiting on several counters

    /// One continuation shared by the counters of a ``waitAny(_:deadline:)``: the first source
    /// to move, the deadline or cancellation finishes it; the others find it finished.
    private final class SharedWait: Sendable {
        private enum Phase {
            case waiting(UnsafeContinuation<Int, any Error>?)
            case finished(Result<Int, any Error>)
            case resumed
        }
        private let phase = Mutex(Phase.waiting(nil))

        /// Installs the continuation; resumes it at once if the wait already finished.
        func install(_ continuation: UnsafeContinuation<Int, any Error>) {
            let early = phase.withLock { phase -> Result<Int, any Error>? in
                if case .finished(let result) = phase {
                    phase = .resumed
                    return result
                }
                phase = .waiting(continuation)
                return nil
            }
            if let early { continuation.resume(with: early) }
        }

        func finish(_ result: Result<Int, any Error>) {
            let continuation = phase.withLock { phase -> UnsafeContinuation<Int, any Error>? in
                guard case .waiting(let continuation) = phase else { return nil }
                if let continuation {
                    phase = .resumed
                    return continuation
                }
                phase = .finished(result)
                return nil
            }
            continuation?.resume(with: result)
        }
    }

    /// Waits until one of `sources` moves past the count its caller saw.
    /// - Parameters:
    ///   - sources: Counters with the snapshot taken before checking the awaited condition.
    ///   - deadline: When to give up.
    /// - Returns: The index in `sources` of a counter that moved (the first one checked when
    ///   several did).
    /// - Throws: `timedOut` at the deadline; `CancellationError` when the task is cancelled.
    nonisolated(nonsending) package static func waitAny(_ sources: [(counter: EventCounter, seen: UInt64)], deadline: Deadline) async throws -> Int {
        for (index, source) in sources.enumerated() where source.counter.snapshot() != source.seen { return index }
        if deadline.hasPassed { throw timedOut }
        let id = nextID.add(1, ordering: .relaxed).newValue
        let wait = SharedWait()
        let timer = deadline.time.map { time in
            DeadlineTimer.shared.schedule(atTime: time) { wait.finish(.failure(timedOut)) }
        }
        defer {
            if let timer { DeadlineTimer.shared.cancel(timer) }
            for source in sources { _ = source.counter.removeWaiter(id) }
        }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Int, any Error>) in
                wait.install(continuation)
                if Task.isCancelled {
                    wait.finish(.failure(CancellationError()))
                    return
                }
                for (index, source) in sources.enumerated() {
                    let moved = source.counter.state.withLock { state -> Bool in
                        if state.count != source.seen { return true }
                        state.add(Waiter(id: id, wake: .shared(wait, index: index)))
                        return false
                    }
                    if moved {
                        wait.finish(.success(index))
                        return
                    }
                }
            }
        } onCancel: {
            wait.finish(.failure(CancellationError()))
        }
    }
}
