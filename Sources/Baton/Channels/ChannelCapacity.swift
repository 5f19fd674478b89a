/// How many elements a ``SharedChannel`` buffers.
public enum ChannelCapacity: Sendable, Hashable, CustomStringConvertible {
    /// No buffer: `send` returns only after a receiver took the element.
    case rendezvous
    /// Up to `n` elements wait in the channel (taken but unacknowledged ones count); `send`
    /// waits for room. `bounded(0)` (or less) behaves as ``rendezvous``.
    case bounded(Int)
    /// The channel grows as needed; `send` never waits.
    case unbounded

    /// The capacity with `bounded(n <= 0)` folded into ``rendezvous``.
    var normalized: ChannelCapacity {
        if case .bounded(let n) = self, n <= 0 { return .rendezvous }
        return self
    }

    /// Parses `rendezvous`, `bounded:N` or `unbounded` (the command line's spelling).
    public init?(parsing text: String) {
        switch text {
        case "rendezvous": self = .rendezvous
        case "unbounded": self = .unbounded
        default:
            guard text.hasPrefix("bounded:"), let n = Int(text.dropFirst("bounded:".count)), n > 0 else { return nil }
            self = .bounded(n)
        }
    }

    public var description: String {
        switch self {
        case .rendezvous: return "rendezvous"
        case .bounded(let n): return "bounded:\(n)"
        case .unbounded: return "unbounded"
        }
    }

    /// How the capacity is stored in a channel file: (kind, n).
    var stored: (kind: UInt32, count: UInt64) {
        switch normalized {
        case .rendezvous: return (0, 0)
        case .bounded(let n): return (1, UInt64(n))
        case .unbounded: return (2, 0)
        }
    }

    init?(storedKind kind: UInt32, count: UInt64) {
        switch kind {
        case 0: self = .rendezvous
        case 1 where count > 0 && count <= UInt64(Int.max): self = .bounded(Int(count))
        case 2: self = .unbounded
        default: return nil
        }
    }
}
