import Synchronization

/// Fans values out to any number of `AsyncStream` subscribers, each of which first receives the
/// latest value. Used for the supervisor's states and reachability updates.
final class Broadcast<Element: Sendable>: Sendable {
    private struct State {
        var latest: Element?
        var nextID: UInt64 = 0
        var subscribers: [UInt64: AsyncStream<Element>.Continuation] = [:]
    }

    private let state: Mutex<State>

    init(initial: Element? = nil) {
        state = Mutex(State(latest: initial))
    }

    var latest: Element? { state.withLock { $0.latest } }

    /// How many values a subscriber that does not keep up may fall behind; older ones are
    /// dropped first (a stalled subscriber must not grow memory without bound).
    static var bufferLimit: Int { 4_096 }

    /// A new subscription: the latest value (if any), then every later one (up to
    /// ``bufferLimit`` not yet consumed).
    func subscribe() -> AsyncStream<Element> {
        let (stream, continuation) = AsyncStream<Element>.makeStream(bufferingPolicy: .bufferingNewest(Self.bufferLimit))
        let id = state.withLock { state -> UInt64 in
            if let latest = state.latest { continuation.yield(latest) }
            state.nextID += 1
            state.subscribers[state.nextID] = continuation
            return state.nextID
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.subscribers.removeValue(forKey: id) }
        }
        return stream
    }

    /// Publishes a value to every subscriber. Values from one publisher arrive in order: the
    /// yield happens under the lock, which is safe because `yield` never blocks nor calls back.
    func yield(_ value: Element) {
        state.withLock { state in
            state.latest = value
            for continuation in state.subscribers.values { continuation.yield(value) }
        }
    }
}
