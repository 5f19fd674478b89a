import CBatonShims

/// One event of a simulation: what happened, to which process, and when.
///
/// Children report their own events (role acquired, message stored, shown...) as JSON lines
/// on their standard output; the simulator, the server and the fault injector add theirs.
/// Times are `CLOCK_MONOTONIC` nanoseconds, comparable across processes of the machine.
public struct SimulatorEvent: Codable, Sendable, Hashable {
    /// When it happened (`CLOCK_MONOTONIC`, nanoseconds).
    public var time: UInt64
    /// The lane: `app#1`, `extension#2`, `server`, `simulator`.
    public var process: String
    /// The process id, 0 for the simulator's own lanes.
    public var pid: Int32
    /// What happened.
    public var kind: Kind
    /// The message concerned, if any.
    public var message: String?
    /// The role epoch concerned, if any.
    public var epoch: UInt64?
    /// Free-form detail (a reason, a signal, a count). Never a message payload.
    public var detail: String?

    public init(kind: Kind, process: String = "", pid: Int32 = getpid(), message: String? = nil, epoch: UInt64? = nil, detail: String? = nil, time: UInt64 = baton_monotonic_ns()) {
        self.time = time
        self.process = process
        self.pid = pid
        self.kind = kind
        self.message = message
        self.epoch = epoch
        self.detail = detail
    }

    private enum CodingKeys: String, CodingKey {
        case time, process, pid, kind, message, epoch, detail
        // The lifecycle protocol's spelling of a report: {"report":"shown","id":"m7"}.
        case report, id
    }

    /// Decodes an event, or a program's report in the lifecycle protocol's spelling
    /// (`{"report":"shown","id":"m7"}`): `report` for `kind`, `id` for `message`, `done` for
    /// `instance-finished`; a missing time is now.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        var kind = try container.decodeIfPresent(Kind.self, forKey: .kind) ?? container.decode(Kind.self, forKey: .report)
        if kind.rawValue == "done" { kind = .instanceFinished }
        self.init(
            kind: kind,
            process: try container.decodeIfPresent(String.self, forKey: .process) ?? "",
            pid: try container.decodeIfPresent(Int32.self, forKey: .pid) ?? 0,
            message: try container.decodeIfPresent(String.self, forKey: .message) ?? container.decodeIfPresent(String.self, forKey: .id),
            epoch: try container.decodeIfPresent(UInt64.self, forKey: .epoch),
            detail: try container.decodeIfPresent(String.self, forKey: .detail),
            time: try container.decodeIfPresent(UInt64.self, forKey: .time) ?? baton_monotonic_ns()
        )
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(time, forKey: .time)
        try container.encode(process, forKey: .process)
        try container.encode(pid, forKey: .pid)
        try container.encode(kind, forKey: .kind)
        try container.encodeIfPresent(message, forKey: .message)
        try container.encodeIfPresent(epoch, forKey: .epoch)
        try container.encodeIfPresent(detail, forKey: .detail)
    }

    /// An event kind; extensible.
    public struct Kind: RawRepresentable, Codable, Hashable, Sendable, CustomStringConvertible {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public init(from decoder: any Decoder) throws { rawValue = try decoder.singleValueContainer().decode(String.self) }
        public func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode(rawValue)
        }
        public var description: String { rawValue }

        // Process lifecycle (recorded by the simulator).
        public static let launched = Kind(rawValue: "launched")
        public static let exited = Kind(rawValue: "exited")
        public static let killed = Kind(rawValue: "killed")
        public static let foreground = Kind(rawValue: "foreground")
        public static let background = Kind(rawValue: "background")
        public static let willSuspend = Kind(rawValue: "will-suspend")
        public static let suspended = Kind(rawValue: "suspended")
        public static let resumed = Kind(rawValue: "resumed")
        public static let stalled = Kind(rawValue: "stalled")
        public static let continued = Kind(rawValue: "continued")
        public static let dead10cc = Kind(rawValue: "dead10cc")
        public static let fault = Kind(rawValue: "fault")
        public static let limit = Kind(rawValue: "limit")
        public static let push = Kind(rawValue: "push")
        public static let timeWillExpire = Kind(rawValue: "time-will-expire")
        // Reported by the children.
        public static let ready = Kind(rawValue: "ready")
        public static let releasedLocks = Kind(rawValue: "released-locks")
        public static let roleAcquired = Kind(rawValue: "role-acquired")
        public static let roleReleased = Kind(rawValue: "role-released")
        public static let connected = Kind(rawValue: "connected")
        public static let disconnected = Kind(rawValue: "disconnected")
        public static let stored = Kind(rawValue: "stored")
        public static let shown = Kind(rawValue: "shown")
        public static let alreadyShown = Kind(rawValue: "already-shown")
        public static let instanceStarted = Kind(rawValue: "instance-started")
        public static let instanceFinished = Kind(rawValue: "instance-finished")
        public static let error = Kind(rawValue: "error")
        // Recorded by the server.
        public static let sent = Kind(rawValue: "sent")
        public static let delivered = Kind(rawValue: "delivered")
        public static let acknowledged = Kind(rawValue: "acknowledged")
        public static let connectionOpened = Kind(rawValue: "connection-opened")
        public static let connectionClosed = Kind(rawValue: "connection-closed")
        public static let overlap = Kind(rawValue: "overlap")
    }
}
