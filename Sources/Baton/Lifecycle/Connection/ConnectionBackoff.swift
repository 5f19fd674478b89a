/// How long a ``ConnectionSupervisor`` waits between connection attempts.
///
/// The first attempt after a stable connection dropped is made at once. Every further attempt
/// waits a random delay between zero and `min(maximumDelay, initialDelay * multiplier^(n-1))`
/// ("full jitter", so that many clients that lost the same server do not return in step).
/// A connection that stayed up for ``stablePeriod`` resets the count.
public struct ConnectionBackoff: Sendable, Hashable {
    /// The cap of the first delayed attempt.
    public var initialDelay: Duration
    /// The largest cap.
    public var maximumDelay: Duration
    /// How much the cap grows per attempt (at least 1).
    public var multiplier: Double
    /// How long a connection must stay up for the next drop to count as a fresh start.
    public var stablePeriod: Duration
    /// Whether delays are drawn uniformly below the cap (full jitter, the default) or are
    /// exactly the cap (for tests and single clients).
    public var jitter: Bool

    /// Creates a policy. Negative durations count as zero, a multiplier below 1 as 1, and a
    /// maximum below the initial delay as the initial delay.
    /// - Parameters:
    ///   - initialDelay: The cap of the first delayed attempt (default 250 ms).
    ///   - maximumDelay: The largest cap (default 60 s).
    ///   - multiplier: Growth of the cap per attempt (default 2).
    ///   - stablePeriod: Up-time after which a drop resets the count (default 10 s).
    ///   - jitter: Full jitter (default) or exact caps.
    public init(
        initialDelay: Duration = .milliseconds(250),
        maximumDelay: Duration = .seconds(60),
        multiplier: Double = 2,
        stablePeriod: Duration = .seconds(10),
        jitter: Bool = true
    ) {
        self.jitter = jitter
        let initial = Swift.max(initialDelay, .zero)
        self.initialDelay = initial
        self.maximumDelay = Swift.max(maximumDelay, initial)
        self.multiplier = multiplier.isFinite ? Swift.max(multiplier, 1) : 1
        self.stablePeriod = Swift.max(stablePeriod, .zero)
    }

    /// The largest delay before attempt `attempt` (0 for the first attempt).
    /// - Parameter attempt: Attempts made since the last stable connection.
    /// - Returns: Zero for attempt 0, else `min(maximumDelay, initialDelay * multiplier^(attempt-1))`.
    public func cap(forAttempt attempt: Int) -> Duration {
        guard attempt > 0 else { return .zero }
        let initial = initialDelay.seconds
        let maximum = maximumDelay.seconds
        var cap = initial
        var step = 1
        while step < attempt && cap < maximum {
            cap *= multiplier
            step += 1
        }
        return .nanoseconds(Int64((Swift.min(cap, maximum) * 1e9).rounded()))
    }

    /// The delay before attempt `attempt`: uniform in `0...cap(forAttempt:)` with jitter, else
    /// the cap itself.
    /// - Parameters:
    ///   - attempt: Attempts made since the last stable connection.
    ///   - generator: The source of randomness.
    /// - Returns: The delay to wait.
    public func delay(forAttempt attempt: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        let cap = cap(forAttempt: attempt).nanoseconds
        guard cap > 0 else { return .zero }
        guard jitter else { return .nanoseconds(cap) }
        return .nanoseconds(Int64.random(in: 0...cap, using: &generator))
    }

    /// A random delay before attempt `attempt`, from the system's generator.
    public func delay(forAttempt attempt: Int) -> Duration {
        var generator = SystemRandomNumberGenerator()
        return delay(forAttempt: attempt, using: &generator)
    }
}
