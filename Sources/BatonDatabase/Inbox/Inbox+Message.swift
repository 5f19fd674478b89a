import Baton

extension Inbox {
    /// The message `id`, for an extension that was woken by a push for it.
    ///
    /// 1. If it is stored already, returns it at once.
    /// 2. If the `main` role is held by a live process (the app runs its core), waits for the app
    ///    to store it: woken by the inbox signal, no polling.
    /// 3. Otherwise acquires the `executor` role and runs `source` until the message has arrived
    ///    and the source has nothing pending, storing everything it receives, then releases the
    ///    role. Concurrent calls in one process share this one run; an extension of another
    ///    process that holds the executor role meanwhile is waited for the same way as the app.
    /// 4. If the app takes the role over during the run, stops the source (what it received is
    ///    stored already) and goes on as in 2.
    /// 5. Returns ``InboxDelivery/timedOut`` ``InboxConfiguration/timeoutMargin`` before
    ///    `deadline`, leaving time to show a generic notification.
    ///
    /// - Parameters:
    ///   - id: The message, as the push named it.
    ///   - deadline: The system's limit for this extension (30 seconds on iOS).
    ///   - source: The network core to run as the executor; `nil` to only wait for another
    ///     process to store the message.
    /// - Returns: The message and how it arrived, or ``InboxDelivery/timedOut``.
    /// - Throws: `invalidArgument` for a bad id; database errors; what the source throws when
    ///   this process runs it; `CancellationError`.
    public func message(id: String, deadline: Deadline, source: (any MessageSource)? = nil) async throws -> InboxDelivery {
        try InboxMessage.validate(id: id)
        let deadline = Self.shifted(deadline, earlierBy: configuration.timeoutMargin)
        let runs = ExecutorRuns.shared
        let observation = try container.signals.observe(configuration.signalName)
        defer { observation.cancel() }
        if let message = try await store.message(id: id) {
            return .message(message, .alreadyStored)
        }
        runs.want(id, in: runKey)
        defer { runs.unwant(id, in: runKey) }
        while true {
            let seen = runs.changes.snapshot()
            if let message = try await store.message(id: id) {
                let route: InboxRoute = runs.wasReceived(id, in: runKey) ? .receivedByThisProcess : .storedByAnotherProcess
                return .message(message, route)
            }
            if deadline.hasPassed { return .timedOut }
            let status = try role.status()
            let roleChanged = Self.change(of: role, from: status)
            let mainIsRunning = (status.holder?.priority ?? .executor) >= .main
            if let source, !mainIsRunning, runs.begin(runKey) {
                // This caller runs the source for the whole process.
                let outcome: ExecutorRun.Outcome
                do {
                    outcome = try await ExecutorRun(inbox: self, source: source, deadline: deadline).perform(until: id)
                } catch {
                    runs.end(runKey)
                    try? container.signals.post(configuration.signalName)
                    throw error
                }
                runs.end(runKey)
                if outcome == .busy {
                    // The role could not be had, or the source ended: wait for something to
                    // change (against the role's status now, not the one before the run).
                    let after = runs.changes.snapshot()
                    let now = try role.status()
                    _ = try await InboxWait.next(
                        signal: observation, local: runs.changes, after: after,
                        role: Self.change(of: role, from: now), deadline: deadline)
                }
                continue
            }
            // The app runs the core, or another caller of this process does, or there is no
            // source: wait for a store, a change of the run, or a change of the role.
            _ = try await InboxWait.next(
                signal: observation, local: runs.changes, after: seen,
                role: source == nil ? nil : roleChanged, deadline: deadline)
        }
    }

    static func shifted(_ deadline: Deadline, earlierBy margin: Duration) -> Deadline {
        guard let instant = deadline.instant else { return deadline }
        return Deadline(instant.advanced(by: .zero - margin))
    }

    /// Waits until the role's status differs from `seen` (the status the caller acted on).
    static func change(of role: Role, from seen: RoleStatus) -> @Sendable () async throws -> Void {
        {
            for try await status in role.statusChanges() where status != seen { return }
            // The feed ended (cancellation): only the other wake-ups remain.
            try Task.checkCancellation()
            try await Task.sleep(for: .seconds(86_400))
        }
    }
}
