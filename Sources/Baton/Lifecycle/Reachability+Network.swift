#if canImport(Network)
import Dispatch
import Network
import Synchronization

/// Reachability on Apple platforms, from `NWPathMonitor`.
///
/// The monitor delivers on a private dispatch queue it owns; that queue is the monitor's kernel
/// wait, not a hidden task. Untested: this package's tests run on Linux.
public final class PathMonitorReachability: Reachability {
    private let monitor: NWPathMonitor
    private let paths = Broadcast<NetworkPath>(initial: NetworkPath(status: .unknown))
    private let generation = Mutex<UInt64>(0)

    /// Starts monitoring every interface type.
    public init() {
        monitor = NWPathMonitor()
        monitor.pathUpdateHandler = { [paths, generation] path in
            let next = generation.withLock { value -> UInt64 in
                value &+= 1
                return value
            }
            let status: NetworkStatus = path.status == .satisfied ? .reachable : .unreachable
            let interfaces = path.availableInterfaces.map(\.name).sorted()
            paths.yield(NetworkPath(status: status, interfaces: interfaces, generation: next))
        }
        monitor.start(queue: DispatchQueue(label: "baton.reachability"))
    }

    deinit { monitor.cancel() }

    public var currentPath: NetworkPath { paths.latest ?? NetworkPath(status: .unknown) }

    public func updates() -> AsyncStream<NetworkPath> { paths.subscribe() }
}
#endif
