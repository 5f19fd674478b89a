#if canImport(Network)
import Dispatch
import Network
import Synchronization

/// Reachability on Apple platforms, from `NWPathMonitor`.
///
/// The monitor delivers on a private dispatch queue it owns; that queue is the monitor's kernel
/// wait, not a hidden task. Type-checked against Network's declarations
/// (scripts/check-apple.sh); not run here.
public final class PathMonitorReachability: Reachability {
    /// The monitor, behind a lock: `NWPathMonitor` is not declared `Sendable`.
    private let monitor: Mutex<NWPathMonitor>
    private let paths = Broadcast<NetworkPath>(initial: NetworkPath(status: .unknown))
    private let generation = Generation()

    /// Starts monitoring every interface type.
    public init() {
        let monitor = NWPathMonitor()
        monitor.pathUpdateHandler = { [paths, generation] path in
            let status: NetworkStatus = path.status == .satisfied ? .reachable : .unreachable
            let interfaces = path.availableInterfaces.map(\.name).sorted()
            paths.yield(NetworkPath(status: status, interfaces: interfaces, generation: generation.next()))
        }
        monitor.start(queue: DispatchQueue(label: "baton.reachability"))
        self.monitor = Mutex(monitor)
    }

    deinit { monitor.withLock { $0.cancel() } }

    public var currentPath: NetworkPath { paths.latest ?? NetworkPath(status: .unknown) }

    public func updates() -> AsyncStream<NetworkPath> { paths.subscribe() }

    /// A counter the update handler captures by reference (a `Mutex` cannot be captured).
    private final class Generation: Sendable {
        private let value = Mutex<UInt64>(0)
        func next() -> UInt64 {
            value.withLock { value in
                value &+= 1
                return value
            }
        }
    }
}
#endif
