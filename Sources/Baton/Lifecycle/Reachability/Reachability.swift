/// Whether the network looks usable.
public enum NetworkStatus: String, Sendable, Hashable {
    /// Not known yet.
    case unknown
    /// No usable interface.
    case unreachable
    /// At least one usable interface (up, not loopback, with an address).
    case reachable
}

/// One observation of the network path.
public struct NetworkPath: Sendable, Hashable {
    /// Whether the network looks usable.
    public var status: NetworkStatus
    /// The usable interfaces, by name, sorted.
    public var interfaces: [String]
    /// Moves on every change the monitor saw, so that two updates with the same status and
    /// interfaces (a route change, a new address) are still distinct.
    public var generation: UInt64

    /// Creates a path.
    public init(status: NetworkStatus, interfaces: [String] = [], generation: UInt64 = 0) {
        self.status = status
        self.interfaces = interfaces
        self.generation = generation
    }
}

/// A source of network-path changes. A ``ConnectionSupervisor`` retries at once when it reports
/// a reachable path during a back-off, and pings its connection at once on any change.
///
/// Implementations: ``NetlinkReachability`` (Linux, rtnetlink), `PathMonitorReachability`
/// (Apple platforms, `NWPathMonitor`), ``ManualReachability`` (reported by the app or a simulator).
public protocol Reachability: Sendable {
    /// The latest path.
    var currentPath: NetworkPath { get }

    /// The current path, then one element per change (bursts of kernel events may be coalesced).
    /// The sequence ends when the subscriber stops iterating.
    func updates() -> AsyncStream<NetworkPath>
}
