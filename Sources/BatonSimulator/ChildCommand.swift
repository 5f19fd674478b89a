/// A lifecycle event from the simulator to a program it runs: one JSON object a line on the
/// descriptor `BATON_LIFECYCLE_FD` names, for instance
/// `{"event":"will-suspend","grace_ms":5000}` or `{"event":"push","id":"m7","payload":"hello"}`.
///
/// The protocol is documented in the article "Reproduce 0xDEAD10CC on Linux"; Baton's own app
/// and extension processes (`baton sim-app`, `baton sim-extension`) speak it like any other program.
public struct ChildCommand: Codable, Sendable, Hashable {
    /// What happened.
    public var command: Name
    /// The message id of a push.
    public var message: String?
    /// The payload of a push (a JSON string).
    public var payload: String?
    /// The grace period before the process is stopped (``Name/willSuspend``), in milliseconds.
    public var graceMilliseconds: Int?
    /// The megabytes to allocate (``Name/allocate``, to test the memory limit).
    public var mebibytes: Int?

    public init(_ command: Name, message: String? = nil, payload: String? = nil, graceMilliseconds: Int? = nil, mebibytes: Int? = nil) {
        self.command = command
        self.message = message
        self.payload = payload
        self.graceMilliseconds = graceMilliseconds
        self.mebibytes = mebibytes
    }

    enum CodingKeys: String, CodingKey {
        case command = "event", message = "id", payload, graceMilliseconds = "grace_ms", mebibytes
    }

    /// An event name.
    public enum Name: String, Codable, Sendable, Hashable {
        /// The app: the user opened it (it is in the foreground).
        case foreground = "will-enter-foreground"
        /// The app: the user left it; it keeps running for a while.
        case background = "will-enter-background"
        /// The system will stop the process (SIGSTOP) after `grace_ms`; release every lock now
        /// and report `released-locks`.
        case willSuspend = "will-suspend"
        /// The process was resumed (after SIGCONT); take back what it released.
        case resume = "did-resume"
        /// An extension: a push arrived for `id` (with its `payload`); handle it and report
        /// `instance-finished` (or `done`) with the same `id`.
        case push
        /// An extension: the time of the oldest push it handles is nearly up (iOS's
        /// `serviceExtensionTimeWillExpire`); finish now or be killed.
        case timeWillExpire = "time-will-expire"
        /// Exit now (iOS's `applicationWillTerminate`, or an idle extension reclaimed).
        case exit = "will-terminate"
        /// Baton's own extension: allocate and touch `mebibytes` of memory (tests the memory limit).
        case allocate
    }
}
