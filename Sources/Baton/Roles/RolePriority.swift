/// How strongly a process wants a ``Role``: a higher priority preempts a lower one, and a lower
/// one cannot acquire while a higher one holds the role or waits for it.
///
/// Two levels are built in: ``main`` for the app and ``executor`` for an extension. Any integer
/// is allowed (a notification-service extension might use 50).
public struct RolePriority: Sendable, Hashable, Comparable, Codable, CustomStringConvertible {
    /// The numeric level; higher wins.
    public var value: Int

    /// A priority at `value`.
    public init(_ value: Int) { self.value = value }

    /// The app (100).
    public static let main = RolePriority(100)
    /// An extension, widget or background task (10).
    public static let executor = RolePriority(10)

    public static func < (lhs: RolePriority, rhs: RolePriority) -> Bool { lhs.value < rhs.value }

    /// `main`, `executor`, or the number.
    public var description: String {
        switch self {
        case .main: return "main"
        case .executor: return "executor"
        default: return "\(value)"
        }
    }

    public init(from decoder: any Decoder) throws {
        self.value = try decoder.singleValueContainer().decode(Int.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(value)
    }
}
