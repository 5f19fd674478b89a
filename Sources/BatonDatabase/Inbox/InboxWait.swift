import Baton

/// Waits, without polling, for the first of several wake-ups: a delivery of the inbox signal
/// (another process stored a message), a change inside this process (an executor run started or
/// ended, the source delivered), a change of the role, or the deadline.
///
/// Callers take their snapshots (signal observation created, ``EventCounter/snapshot()``, role
/// changes subscribed) before they check their condition, then wait here; a wake-up that landed
/// in between is never missed.
enum InboxWait {
    /// Returns `true` when something happened, `false` when the deadline passed.
    /// - Throws: `CancellationError` when the task is cancelled.
    static func next(
        signal observation: SignalObservation,
        local changes: EventCounter,
        after seen: UInt64,
        role roleChange: (@Sendable () async throws -> Void)?,
        deadline: Deadline
    ) async throws -> Bool {
        if deadline.hasPassed { return false }
        return try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                do {
                    _ = try await observation.next(deadline: deadline)
                    return true
                } catch let error as BatonError where error.code == .timedOut {
                    return false
                }
            }
            group.addTask {
                try await changes.wait(after: seen, deadline: .never)
                return true
            }
            if let roleChange {
                group.addTask {
                    try await roleChange()
                    return true
                }
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { return false }
            return first
        }
    }
}
