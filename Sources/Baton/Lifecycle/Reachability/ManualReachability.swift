import Synchronization

/// Reachability reported by the app or by a simulator, rather than observed from the system.
///
/// ```swift
/// let reachability = ManualReachability()
/// reachability.report(.unreachable)
/// reachability.report(.reachable)   // a supervisor in back-off retries at once
/// ```
public final class ManualReachability: Reachability {
    private let broadcast: Broadcast<NetworkPath>
    private let generation = Mutex<UInt64>(0)

    /// Creates a monitor with an initial status.
    /// - Parameter status: The status before the first report.
    public init(_ status: NetworkStatus = .unknown) {
        broadcast = Broadcast(initial: NetworkPath(status: status))
    }

    public var currentPath: NetworkPath { broadcast.latest ?? NetworkPath(status: .unknown) }

    public func updates() -> AsyncStream<NetworkPath> { broadcast.subscribe() }

    /// Reports a change.
    /// - Parameters:
    ///   - status: The new status.
    ///   - interfaces: The usable interfaces, if known.
    public func report(_ status: NetworkStatus, interfaces: [String] = []) {
        let next = generation.withLock { value -> UInt64 in
            value &+= 1
            return value
        }
        broadcast.yield(NetworkPath(status: status, interfaces: interfaces.sorted(), generation: next))
    }
}
