/// The process found holding a contended resource (the `cause` of a `busy` error).
public struct HolderProcess: Error, Sendable, Hashable, CustomStringConvertible {
    /// Its process id.
    public var pid: Int32
    /// Its presence kind, when it registered one.
    public var kind: String?

    public init(pid: Int32, kind: String? = nil) {
        self.pid = pid
        self.kind = kind
    }

    public var description: String { kind.map { "process \(pid) (\($0))" } ?? "process \(pid)" }
}
