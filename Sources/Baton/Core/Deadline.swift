import CBatonShims
/// A point in time by which a wait must end.
///
/// Every blocking operation in Baton takes a deadline and is also cancellable. Build one from a
/// duration (`.after(.seconds(2))`), from a ``TimeBudget`` when one exists, or use ``never``.
public struct Deadline: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// The deadline as nanoseconds on the time base of Baton's wait threads
    /// (``KernelWaitThread/time(_:)``), or `nil` for no deadline.
    ///
    /// Stored as a plain integer, not as a `ContinuousClock.Instant`: the standard library
    /// does not fix that type's layout, so every copy of a deadline holding one went through
    /// runtime type metadata, in every wait, `never` included.
    package let time: Int64?

    /// The instant on the continuous clock, or `nil` for no deadline (to the nanosecond).
    public var instant: ContinuousClock.Instant? { time.map(KernelWaitThread.instant) }

    /// A deadline at the given instant (to the nanosecond).
    public init(_ instant: ContinuousClock.Instant) { self.time = KernelWaitThread.time(instant) }

    private init(time: Int64?) { self.time = time }

    /// No deadline: the wait ends only when it succeeds or its task is cancelled.
    public static var never: Deadline { Deadline(time: nil) }

    /// A deadline `duration` from now.
    public static func after(_ duration: Duration) -> Deadline {
        Deadline(ContinuousClock.now.advanced(by: duration))
    }

    /// A deadline `seconds` from now.
    ///
    /// A number of seconds too large for the clock (beyond about 292 years, including
    /// `+infinity`) saturates to ``never``.
    /// - Throws: `invalidArgument` for NaN or a negative number.
    public static func seconds(_ seconds: Double) throws -> Deadline {
        guard !seconds.isNaN else {
            throw BatonError(.invalidArgument, "a deadline of NaN seconds was given; pass a number of seconds from 0 up, or Deadline.never")
        }
        guard seconds >= 0 else {
            throw BatonError(.invalidArgument, "a deadline of a negative number of seconds was given; pass a number of seconds from 0 up")
        }
        // Int64 nanoseconds reach about 9.2e9 s; anything beyond is "never" for every purpose.
        guard seconds < Double(Int64.max) / 1e9 else { return .never }
        return after(.nanoseconds(Int64(seconds * 1e9)))
    }

    /// Whether the deadline has passed.
    public var hasPassed: Bool {
        guard let time else { return false }
        return KernelWaitThread.now() >= time
    }

    /// Whether the deadline has passed at `now` (a time from ``KernelWaitThread/now()``).
    package func hasPassed(at now: Int64) -> Bool {
        guard let time else { return false }
        return now >= time
    }

    /// The timeout of a kernel sleep until the deadline, for ``AddressWait``: nanoseconds,
    /// never negative, or -1 (no timeout) for ``never``.
    package var sleepTimeout: Int64 { KernelWaitThread.timeout(until: time) }

    /// Time left, `nil` for ``never``, zero when passed.
    public var remaining: Duration? {
        guard let time else { return nil }
        return .nanoseconds(max(0, time &- KernelWaitThread.now()))
    }

    /// The earlier of two deadlines.
    public func earliest(_ other: Deadline) -> Deadline { Swift.min(self, other) }

    public static func < (lhs: Deadline, rhs: Deadline) -> Bool {
        switch (lhs.time, rhs.time) {
        case (nil, _): return false
        case (_, nil): return true
        case let (l?, r?): return l < r
        }
    }

    public var description: String {
        guard let remaining else { return "never" }
        return "in \(remaining)"
    }
}

extension Duration {
    /// The duration in seconds as a `Double`.
    package var seconds: Double {
        let (s, attoseconds) = components
        return Double(s) + Double(attoseconds) / 1e18
    }

    /// The duration in nanoseconds, saturating.
    package var nanoseconds: Int64 {
        let (s, attoseconds) = components
        let (product, overflow) = s.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return s < 0 ? .min : .max }
        return product &+ attoseconds / 1_000_000_000
    }
}
