import CBatonShims

/// What a ``ConnectionSupervisor`` is doing.
public enum ConnectionState: Sendable, Hashable, CustomStringConvertible {
    /// Not allowed to connect: the process does not hold the permit (the role), or is suspended.
    case waitingForPermit
    /// Calling `connect()` (published once the attempt has started; a `connect()` that returns
    /// without suspending may be done by then, and ``connected(since:)`` follows at once).
    /// `attempt` counts the attempts since the last stable connection (0 is the first, made at
    /// once).
    case connecting(attempt: Int)
    /// A connection is up.
    case connected(since: ContinuousClock.Instant)
    /// Backing off before the next attempt (which comes earlier if the network comes back).
    case waiting(until: ContinuousClock.Instant, attempt: Int)
    /// ``ConnectionSupervisor/run()`` has returned.
    case stopped

    /// Whether this is ``connected(since:)``.
    public var isConnected: Bool {
        if case .connected = self { return true }
        return false
    }

    public var description: String {
        switch self {
        case .waitingForPermit: return "waitingForPermit"
        case .connecting(let attempt): return "connecting(attempt: \(attempt))"
        case .connected: return "connected"
        case .waiting(let until, let attempt):
            let left = until - ContinuousClock.now
            return "waiting(\(left < .zero ? .zero : left), attempt: \(attempt))"
        case .stopped: return "stopped"
        }
    }
}
