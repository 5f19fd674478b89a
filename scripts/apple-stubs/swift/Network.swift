// A stand-in for Apple's Network framework, for type-checking Baton's Network adapter on Linux.
// Never linked or run. Only what Baton calls, with the Swift declarations Apple documents
// (developer.apple.com/documentation/network/...).
import Dispatch

/// developer.apple.com/documentation/network/nwinterface (`struct NWInterface`; `name: String`).
public struct NWInterface: Hashable, Sendable {
    /// developer.apple.com/documentation/network/nwinterface/name
    public let name: String
}

/// developer.apple.com/documentation/network/nwpath (`struct NWPath`). Its Sendable
/// conformance could not be confirmed from Apple's pages, so the stub leaves it out: the
/// stricter assumption (code that checks against it also compiles if it is Sendable).
public struct NWPath {
    /// developer.apple.com/documentation/network/nwpath/status-swift.enum
    public enum Status: Equatable, Sendable {
        case satisfied
        case unsatisfied
        case requiresConnection
    }
    /// developer.apple.com/documentation/network/nwpath/status-swift.property
    public let status: Status
    /// developer.apple.com/documentation/network/nwpath/availableinterfaces
    public let availableInterfaces: [NWInterface]
}

/// developer.apple.com/documentation/network/nwpathmonitor (`final class NWPathMonitor`).
/// Not declared Sendable here: Apple's page does not show the conformance, so the stub takes
/// the stricter assumption.
public final class NWPathMonitor {
    /// developer.apple.com/documentation/network/nwpathmonitor/init()
    public init() {}
    /// developer.apple.com/documentation/network/nwpathmonitor/pathupdatehandler
    @preconcurrency public final var pathUpdateHandler: (@Sendable (NWPath) -> Void)?
    /// developer.apple.com/documentation/network/nwpathmonitor/start(queue:)
    public final func start(queue: DispatchQueue) {}
    /// developer.apple.com/documentation/network/nwpathmonitor/cancel()
    public final func cancel() {}
}
