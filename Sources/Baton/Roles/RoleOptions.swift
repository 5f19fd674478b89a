/// How a ``Role`` arbitrates, from the point of view of the process that asks for it.
public struct RoleOptions: Sendable, Hashable {
    /// How long a lower-priority holder has, after this process asks it to stop, before this
    /// process overtakes it (the epoch moves on and the old holder's token becomes invalid).
    public var gracePeriod: Duration
    /// How long this process waits at most, counted from its stop request, for a holder that is
    /// inside a critical section before overtaking it.
    public var maximumCriticalWait: Duration
    /// Waits re-check the role's record at least this often even without a wake-up (a backstop
    /// for platforms without close events; on Linux wake-ups come from the kernel).
    public var backstopInterval: Duration

    /// Options with a 2-second grace period and a 30-second bound on critical sections.
    public init(
        gracePeriod: Duration = .seconds(2),
        maximumCriticalWait: Duration = .seconds(30),
        backstopInterval: Duration = .milliseconds(250)
    ) {
        self.gracePeriod = gracePeriod
        self.maximumCriticalWait = maximumCriticalWait
        self.backstopInterval = backstopInterval
    }
}
