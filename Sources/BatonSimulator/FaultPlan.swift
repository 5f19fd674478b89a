/// The faults a chaos run injects, decided up front from a seed: the same seed and length give
/// the same schedule.
public struct FaultPlan: Sendable, Hashable, Codable {
    /// One injected fault.
    public struct Fault: Sendable, Hashable, Codable, CustomStringConvertible {
        /// Seconds after the start of the run.
        public var at: Double
        /// Which process it hits.
        public var target: Target
        /// What it does.
        public var action: Action

        public var description: String {
            let seconds = (at * 1000).rounded() / 1000
            switch action {
            case .kill: return "\(seconds)s kill \(target.rawValue)"
            case .stall(let milliseconds): return "\(seconds)s stall \(target.rawValue) \(milliseconds)ms"
            }
        }
    }

    /// The process a fault hits, chosen when it fires among the live ones.
    public enum Target: String, Sendable, Hashable, Codable {
        /// The app, whatever its state.
        case app
        /// An extension process (the oldest live one).
        case `extension`
        /// Whichever process holds the core role now.
        case coreHolder = "core-holder"
    }

    /// What a fault does.
    public enum Action: Sendable, Hashable, Codable {
        /// SIGKILL, as a crash or the system's jetsam.
        case kill
        /// SIGSTOP, then SIGCONT after this many milliseconds (a process that stalls).
        case stall(milliseconds: Int)
    }

    /// The faults in time order.
    public var faults: [Fault]

    public init(faults: [Fault]) { self.faults = faults.sorted { $0.at < $1.at } }

    /// A random schedule: about one fault every `interval` seconds within `window`.
    /// - Parameters:
    ///   - seed: The seed; the same seed gives the same schedule.
    ///   - window: The seconds of the run in which faults may fire.
    ///   - interval: The mean time between faults, in seconds.
    ///   - maximumStall: The longest stall, in milliseconds; keep it under the role's grace
    ///     period, or a stalled holder is overtaken while still connected.
    public static func random(seed: UInt64, window: ClosedRange<Double>, interval: Double = 2.5, maximumStall: Int = 800) -> FaultPlan {
        var generator = SeededGenerator(seed: seed)
        var faults: [Fault] = []
        var time = window.lowerBound
        while true {
            time += Double.random(in: interval * 0.4...interval * 1.6, using: &generator)
            guard time < window.upperBound else { break }
            let target: Target = [.app, .extension, .extension, .coreHolder].randomElement(using: &generator)!
            let action: Action = Int.random(in: 0..<5, using: &generator) < 2
                ? .kill
                : .stall(milliseconds: Int.random(in: 100...maximumStall, using: &generator))
            faults.append(Fault(at: time, target: target, action: action))
        }
        return FaultPlan(faults: faults)
    }
}
