import Baton
import Synchronization

/// One run of the source by this process as the executor: acquire the `executor` role (unless the
/// wanted message is stored first), run the source until every message wanted in this process is
/// stored and the source has nothing pending, then release. Stops early when the app asks for the
/// role (a stop request) or at the deadline.
struct ExecutorRun {
    enum Outcome: Sendable, Equatable {
        /// Every wanted message is stored and the source had nothing pending (or they were stored
        /// by someone else before the source had to run).
        case completed
        /// The wanted message was stored by another process while this one waited for the role.
        case storedMeanwhile
        /// A higher priority asked for the role; the source was stopped and the role released.
        case preempted
        /// The role could not be had now (held by a higher priority), or the source ended.
        case busy
        /// The deadline passed.
        case deadline
    }

    let inbox: Inbox
    let source: any MessageSource
    let deadline: Deadline

    func perform(until id: String) async throws -> Outcome {
        let lease: RoleLease
        switch try await acquire(racing: id) {
        case .lease(let acquired): lease = acquired
        case .outcome(let outcome): return outcome
        }
        let outcome: Outcome
        do {
            let wanted = ExecutorRuns.shared.wanted(in: inbox.runKey)
            if try await inbox.store.containsAll(wanted) {
                // The previous executor stored them all and drained its source already.
                outcome = .completed
            } else {
                outcome = try await runSource(under: lease)
            }
        } catch {
            await lease.release()
            throw error
        }
        await lease.release()
        return outcome
    }

    // MARK: Acquiring

    private enum Acquisition: Sendable {
        case lease(RoleLease)
        case outcome(Outcome)
    }

    /// Acquires the executor role, unless `id` is stored first (by the app or by another
    /// extension that holds the role now).
    private func acquire(racing id: String) async throws -> Acquisition {
        let inbox = self.inbox
        let deadline = self.deadline
        return try await withThrowingTaskGroup(of: Acquisition.self) { group in
            group.addTask {
                do {
                    let lease = try await inbox.role.acquire(priority: .executor, kind: inbox.configuration.executorKind, deadline: deadline)
                    return .lease(lease)
                } catch let error as BatonError where error.code == .busy {
                    return .outcome(.busy)
                } catch let error as BatonError where error.code == .timedOut {
                    return .outcome(.deadline)
                }
            }
            group.addTask {
                let observation = try inbox.container.signals.observe(inbox.configuration.signalName)
                defer { observation.cancel() }
                let changes = ExecutorRuns.shared.changes
                while true {
                    let seen = changes.snapshot()
                    if try await inbox.store.message(id: id) != nil { return .outcome(.storedMeanwhile) }
                    guard try await InboxWait.next(signal: observation, local: changes, after: seen, role: nil, deadline: deadline) else {
                        return .outcome(.deadline)
                    }
                }
            }
            var first: Acquisition?
            var failure: (any Error)?
            do {
                first = try await group.next()
            } catch {
                failure = error
            }
            group.cancelAll()
            // A lease granted just as the other side won is released, never leaked.
            while true {
                do {
                    guard let late = try await group.next() else { break }
                    if case .lease(let lease) = late { await lease.release() }
                } catch {
                    continue
                }
            }
            if let failure, first == nil { throw failure }
            return first ?? .outcome(.deadline)
        }
    }

    // MARK: Running the source

    private func runSource(under lease: RoleLease) async throws -> Outcome {
        let inbox = self.inbox
        let source = self.source
        let deadline = self.deadline
        let runs = ExecutorRuns.shared
        let key = inbox.runKey
        let drained = DrainedFlag()
        let sink = MessageSink(
            deliver: { message in
                drained.set(false)
                _ = try await inbox.store(message)
                runs.noteReceived(message.id, in: key)
            },
            nothingPending: {
                drained.set(true)
                runs.changes.notify()
            })
        return try await withThrowingTaskGroup(of: Outcome.self) { group in
            group.addTask {
                try await source.run(delivering: sink)
                return .busy
            }
            group.addTask {
                for try await _ in lease.stopRequests { return .preempted }
                return .preempted
            }
            group.addTask {
                while true {
                    let seen = runs.changes.snapshot()
                    if drained.value, try await inbox.store.containsAll(runs.wanted(in: key)) {
                        return .completed
                    }
                    try await runs.changes.wait(after: seen, deadline: .never)
                }
            }
            if let instant = deadline.instant {
                group.addTask {
                    try await Task.sleep(until: instant, clock: .continuous)
                    return .deadline
                }
            }
            defer { group.cancelAll() }
            return try await group.next() ?? .busy
        }
    }

    /// Whether the source said it has nothing pending since its last delivery.
    private final class DrainedFlag: Sendable {
        private let state = Mutex(false)
        var value: Bool { state.withLock { $0 } }
        func set(_ value: Bool) { state.withLock { $0 = value } }
    }
}
