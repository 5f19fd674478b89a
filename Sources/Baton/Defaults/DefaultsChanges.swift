import Synchronization

/// The names of keys whose value changed, in any process, as an `AsyncSequence`
/// (``SharedDefaults/changes()`` and ``SharedDefaults/changes(forKey:)``).
///
/// Observation starts when the sequence is created: every change made after that is delivered.
/// Changes coalesce: a key set three times quickly may be delivered once; read the value when
/// it arrives. Setting a key to the value it already has is not a change. Iterate from one task;
/// iteration ends (returns `nil`) when the task is cancelled or ``cancel()`` is called.
///
/// Writers ring the suite's signal only while some process observes it, so a store nobody
/// watches pays nothing for notifications.
public struct DefaultsChanges: AsyncSequence, Sendable {
    public typealias Element = String
    let watcher: DefaultsWatcher

    /// The next changed key; throws `timedOut` at the deadline, `CancellationError` when
    /// cancelled or after ``cancel()``.
    public func next(deadline: Deadline) async throws -> String {
        try await watcher.next(deadline: deadline)
    }

    /// Stops observing.
    public func cancel() { watcher.cancel() }

    public func makeAsyncIterator() -> Iterator { Iterator(watcher: watcher) }

    /// Iterates changed keys.
    public struct Iterator: AsyncIteratorProtocol {
        let watcher: DefaultsWatcher

        /// The next changed key, or `nil` once cancelled.
        /// - Throws: a ``BatonError`` when the log cannot be read.
        public mutating func next() async throws -> String? {
            do {
                return try await watcher.next(deadline: .never)
            } catch is CancellationError {
                return nil
            }
        }
    }
}

/// One observation: a signal observation of the suite, and a cursor into the log.
final class DefaultsWatcher: Sendable {
    let store: DefaultsStore
    let observation: SignalObservation
    private struct State {
        var cursor: DefaultsStore.Cursor
        var pending: [String] = []
        var pendingIndex = 0
    }
    private let state: Mutex<State>

    init(store: DefaultsStore, key: String?) throws {
        self.store = store
        // Observe first, then count as a watcher, then take the baseline: a write that missed
        // the watcher count is already in the baseline, and every later one rings.
        observation = try store.container.signals.observe(store.signalName)
        store.addWatcher()
        do {
            state = Mutex(State(cursor: try store.makeCursor(filter: key)))
        } catch {
            store.removeWatcher()
            observation.cancel()
            throw error
        }
    }

    nonisolated(nonsending) func next(deadline: Deadline) async throws -> String {
        while true {
            try Task.checkCancellation()
            let key = try state.withLock { state -> String? in
                if state.pendingIndex == state.pending.count {
                    state.pending = try store.changedKeys(&state.cursor)
                    state.pendingIndex = 0
                }
                guard state.pendingIndex < state.pending.count else { return nil }
                defer { state.pendingIndex += 1 }
                return state.pending[state.pendingIndex]
            }
            if let key { return key }
            _ = try await observation.next(deadline: deadline)
        }
    }

    func cancel() { observation.cancel() }

    deinit {
        store.removeWatcher()
        observation.cancel()
    }
}
