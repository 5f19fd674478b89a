import Synchronization

/// A ``BackgroundTaskProvider`` driven in-process: it models the iOS rules (time runs out only
/// in the background; a task begun when the time is already gone expires at once) and records
/// every begin and end so that a test or a simulator can check that none leaked.
public final class LocalBackgroundTasks: BackgroundTaskProvider {
    private struct State {
        var nextID = 0
        var active: [Int: (name: String, onExpiration: @Sendable () -> Void)] = [:]
        var begun = 0
        var ended = 0
        var expired = false
    }

    private let state = Mutex(State())

    /// Creates a provider with time left.
    public init() {}

    /// The names of the tasks begun and not ended yet.
    public var activeTasks: [String] { state.withLock { $0.active.values.map(\.name).sorted() } }
    /// How many tasks were begun.
    public var begunCount: Int { state.withLock { $0.begun } }
    /// How many tasks were ended.
    public var endedCount: Int { state.withLock { $0.ended } }
    /// Whether the time is up (``expire()`` was called and ``renew()`` was not).
    public var isExpired: Bool { state.withLock { $0.expired } }

    public func beginTask(named name: String, onExpiration: @escaping @Sendable () -> Void) -> BackgroundTaskToken {
        let (id, expiredAlready) = state.withLock { state -> (Int, Bool) in
            state.nextID += 1
            state.begun += 1
            if !state.expired { state.active[state.nextID] = (name, onExpiration) }
            return (state.nextID, state.expired)
        }
        if expiredAlready { onExpiration() }
        return BackgroundTaskToken(rawValue: id)
    }

    public func endTask(_ token: BackgroundTaskToken) {
        state.withLock { state in
            state.ended += 1
            state.active[token.rawValue] = nil
        }
    }

    /// The time is up: calls the expiration handler of every active task. Tasks begun later
    /// expire at once until ``renew()``.
    public func expire() {
        let handlers = state.withLock { state -> [@Sendable () -> Void] in
            state.expired = true
            return state.active.values.map(\.onExpiration)
        }
        for handler in handlers { handler() }
    }

    /// Grants time again (the process came back to the foreground).
    public func renew() {
        state.withLock { $0.expired = false }
    }
}
