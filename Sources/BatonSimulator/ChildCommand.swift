/// A command from the simulator to a child, one JSON object a line on the child's standard input.
public struct ChildCommand: Codable, Sendable, Hashable {
    /// What to do.
    public var command: Name
    /// The message of a push.
    public var message: String?
    /// The megabytes to allocate (``Name/allocate``, to test the memory limit).
    public var mebibytes: Int?

    public init(_ command: Name, message: String? = nil, mebibytes: Int? = nil) {
        self.command = command
        self.message = message
        self.mebibytes = mebibytes
    }

    /// A command name.
    public enum Name: String, Codable, Sendable, Hashable {
        /// The app: the user opened it.
        case foreground
        /// The app: the user left it; it keeps running for a while.
        case background
        /// The app: the system will suspend it after a grace period; release every lock now.
        case willSuspend = "will-suspend"
        /// The app: it was resumed (after SIGCONT); take back what it released.
        case resume
        /// An extension: a push arrived for `message`; start an instance for it.
        case push
        /// An extension: allocate and touch `mebibytes` of memory (tests the memory limit).
        case allocate
        /// Exit cleanly.
        case exit
    }
}
