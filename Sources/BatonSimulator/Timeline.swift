import CBatonShims
import Synchronization

/// Every event of a simulation, in the order recorded, with an optional live listener.
public final class Timeline: Sendable {
    private let state = Mutex<[SimulatorEvent]>([])
    private let listener: (@Sendable (SimulatorEvent) -> Void)?
    /// The start of the simulation (`CLOCK_MONOTONIC`, nanoseconds).
    public let origin: UInt64

    /// - Parameter listener: Called for each event as it is recorded (for progress output).
    public init(listener: (@Sendable (SimulatorEvent) -> Void)? = nil) {
        self.origin = baton_monotonic_ns()
        self.listener = listener
    }

    /// Records an event.
    public func record(_ event: SimulatorEvent) {
        state.withLock { $0.append(event) }
        listener?(event)
    }

    /// Records an event of a simulator-side lane.
    public func record(_ kind: SimulatorEvent.Kind, process: String, pid: Int32 = 0, message: String? = nil, epoch: UInt64? = nil, detail: String? = nil) {
        record(SimulatorEvent(kind: kind, process: process, pid: pid, message: message, epoch: epoch, detail: detail))
    }

    /// Every event so far, sorted by time.
    public var events: [SimulatorEvent] {
        state.withLock { $0 }.enumerated().sorted { ($0.element.time, $0.offset) < ($1.element.time, $1.offset) }.map(\.element)
    }

    /// Seconds since ``origin`` for a monotonic time.
    public func seconds(_ time: UInt64) -> Double {
        time >= origin ? Double(time - origin) / 1e9 : -Double(origin - time) / 1e9
    }
}
