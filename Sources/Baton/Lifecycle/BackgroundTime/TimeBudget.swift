/// The time the system gives this process (an iOS extension has about 30 s), with a warning
/// before the end and a safety margin in which Baton gives up its locks.
///
/// ```swift
/// let budget = TimeBudget(duration: .seconds(30), warningMargin: .seconds(5))
/// try await withThrowingTaskGroup(of: Void.self) { group in
///     group.addTask { try await budget.enforce(on: container) }      // expires Baton in time
///     group.addTask { try await budget.willExpire(); await wrapUp() } // the warning
///     let lock = try await FileLock(container, name: "x.lock")
///         .lock(.exclusive, deadline: budget.deadline)                // every wait ends in time
///     ...
/// }
/// ```
///
/// Three instants: ``warning`` (`end - warningMargin`, Linphone stops at 25 s of 30), then
/// ``expiry`` (`end - expiryMargin`, Phoenix at 29.5 s) where ``enforce(on:)`` expires the
/// container so no lock is held, then ``end``, when the system would kill the process.
public struct TimeBudget: Sendable, Hashable, CustomStringConvertible {
    /// When the system ends the process.
    public let end: ContinuousClock.Instant
    /// How long before ``end`` the warning comes.
    public let warningMargin: Duration
    /// How long before ``end`` Baton expires (releases every lock).
    public let expiryMargin: Duration

    /// A budget ending at `end`.
    /// - Parameters:
    ///   - end: When the system ends the process.
    ///   - warningMargin: Warning this long before the end (default 5 s). Raised to
    ///     `expiryMargin` if smaller, so the warning never comes after the expiry.
    ///   - expiryMargin: Expire Baton this long before the end (default 500 ms). Negative
    ///     margins count as zero.
    public init(
        end: ContinuousClock.Instant,
        warningMargin: Duration = .seconds(5),
        expiryMargin: Duration = .milliseconds(500)
    ) {
        let expiry = Swift.max(expiryMargin, .zero)
        self.end = end
        self.expiryMargin = expiry
        self.warningMargin = Swift.max(warningMargin, expiry)
    }

    /// A budget of `duration` from now.
    /// - Parameters:
    ///   - duration: The time the system gives (about 30 s for an iOS extension).
    ///   - warningMargin: See ``init(end:warningMargin:expiryMargin:)``.
    ///   - expiryMargin: See ``init(end:warningMargin:expiryMargin:)``.
    public init(
        duration: Duration,
        warningMargin: Duration = .seconds(5),
        expiryMargin: Duration = .milliseconds(500)
    ) {
        self.init(end: ContinuousClock.now.advanced(by: duration), warningMargin: warningMargin, expiryMargin: expiryMargin)
    }

    /// A budget ending at a deadline; `nil` for ``Deadline/never`` (no budget).
    /// - Parameters:
    ///   - deadline: When the system ends the process.
    ///   - warningMargin: See ``init(end:warningMargin:expiryMargin:)``.
    ///   - expiryMargin: See ``init(end:warningMargin:expiryMargin:)``.
    public init?(
        deadline: Deadline,
        warningMargin: Duration = .seconds(5),
        expiryMargin: Duration = .milliseconds(500)
    ) {
        guard let instant = deadline.instant else { return nil }
        self.init(end: instant, warningMargin: warningMargin, expiryMargin: expiryMargin)
    }

    /// When the warning comes (``willExpire()`` returns).
    public var warning: ContinuousClock.Instant { end.advanced(by: .zero - warningMargin) }

    /// When Baton expires (``enforce(on:)``).
    public var expiry: ContinuousClock.Instant { end.advanced(by: .zero - expiryMargin) }

    /// The deadline to give every Baton wait: the expiry, so that no wait outlives the budget.
    /// Combine with a wait's own limit: `.after(.seconds(2)).earliest(budget.deadline)`.
    public var deadline: Deadline { Deadline(expiry) }

    /// Time left until the expiry (zero once passed).
    public var remaining: Duration { Swift.max(expiry - ContinuousClock.now, .zero) }

    /// Whether the warning time has come.
    public var isExpiring: Bool { ContinuousClock.now >= warning }

    /// Whether the expiry has passed.
    public var hasExpired: Bool { ContinuousClock.now >= expiry }

    /// Throws `expired` once the expiry has passed: call before starting new work.
    /// - Parameter doing: What was about to start, for the message.
    /// - Throws: `expired`.
    public func check(_ doing: @autoclosure () -> String = "continue") throws {
        if hasExpired {
            throw BatonError(.expired, "cannot \(doing()): the time budget ran out; finish and let the process end")
        }
    }

    /// Waits until the warning time (returns at once if it has passed).
    /// - Throws: `CancellationError` when cancelled first.
    public func willExpire() async throws {
        try await Task.sleep(until: warning, clock: .continuous)
    }

    /// Waits until the expiry, then expires the container: every lock it holds is released and
    /// no new one can be taken. Run it as a service beside the work.
    /// - Parameter container: The container to expire.
    /// - Throws: `CancellationError` when cancelled before the expiry (nothing is expired).
    public func enforce(on container: SharedContainer) async throws {
        try await Task.sleep(until: expiry, clock: .continuous)
        await container.suspension.expire()
    }

    public var description: String {
        "TimeBudget(remaining: \(remaining), warning margin: \(warningMargin), expiry margin: \(expiryMargin))"
    }
}

extension Deadline {
    /// The budget's deadline (its expiry), for any Baton wait.
    /// - Parameter budget: The process's time budget.
    public init(_ budget: TimeBudget) { self.init(budget.expiry) }
}
