import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization

/// Acquiring a role across processes: the waiting loop of one process's request.
///
/// Each pass is one transition under the arbiter lock that either grants the role (a new epoch,
/// and this process's holder file locked), or records why the process must wait: a higher
/// priority waits or holds, or this process asked a lower-priority holder to stop and its grace
/// period (or the bound on its critical section) has not run out. A process that must wait locks
/// its waiter file, so lower priorities see it. Between passes it sleeps until the role's signal
/// rings (releases, stop requests, critical sections, waiters leaving, this process suspending),
/// a lock file in the role's directory is closed (a holder or waiter died: the kernel's word, no
/// heartbeat), the grace period ends, or the deadline passes. The wait is one continuation shared
/// by the signal's and the close events' counters and one timer (``EventCounter/waitAny``): the
/// thread that sees the event resumes the acquisition, with no task group in between. Right
/// after asking a live holder to stop, it first sleeps on its own thread for a short while
/// (``RoleDirectory/handOverWatch``), where the holder's release wakes it directly; the signal
/// and the close events (``WaitSources``) are listened to from the process's first wait past
/// that.
extension RoleCore {
    private enum Decision {
        /// `replaced`: the record named a holder (another process's, alive or not, or this
        /// process's own older grant), which learns of the grant from the role's signal.
        case granted(epoch: UInt64, previous: RoleRecord.HolderEntry?, replaced: Bool)
        case wait(until: UInt64?, blocker: Blocker, entitled: Bool, byHolder: Bool)
    }

    /// Who the acquisition waits for, described only when a message needs it: the description
    /// (five interpolations) took 0.55-0.59 µs, built before in every pass that waits, the one
    /// that asks a holder to stop among them.
    private enum Blocker: CustomStringConvertible {
        case waiter(RoleDirectory.WaiterEntry)
        case holder(RoleRecord.HolderEntry)

        var description: String {
            switch self {
            case .waiter(let higher):
                "a process of priority \(higher.priority) (pid \(higher.pid), kind \(higher.kind)) is waiting for it"
            case .holder(let holder):
                "held by priority \(RolePriority(Int(holder.priority))) (pid \(holder.pid), kind \(holder.kind), epoch \(holder.epoch), \(holder.state.rawValue))"
            }
        }
    }

    private enum Wake: Sendable { case signal(SignalDelivery, posts: UInt64), files, timeout }

    /// Acquires the role for this process (the caller holds the process's turn).
    /// - Returns: The epoch granted; this process's holder file is locked.
    func acquireAcrossProcesses(
        priority: RolePriority,
        kind: String,
        options: RoleOptions,
        deadline: Deadline
    ) async throws -> UInt64 {
        try checkActive("acquire role \(name)")
        _ = try container.signals
        var postedStop = false
        var granted = false
        defer {
            let waited = waiterLock.isLocked
            waiterLock.unlock()
            if (waited || postedStop) && !granted && !state.withLock({ $0.suspended }) {
                let waiterID = waiterLock.id
                _ = try? directory.transition { transaction in
                    transaction.record.waiters.removeAll { $0.id == waiterID }
                    guard transaction.record.stop?.waiterID == waiterID else { return }
                    transaction.record.stop = nil
                    if transaction.record.holder?.state == .stopping { transaction.record.holder?.state = .running }
                }
            }
            if waited && !granted { ring() }
        }
        // After a close event while the holder still looks alive: the kernel reports a dying
        // process's closes one by one (the arbiter's, the record's...) and drops its holder lock
        // just after that file's own close, so look again shortly, then keep waiting for the
        // next close with a short backstop.
        let quickRetries: [Duration] = [.microseconds(20), .microseconds(100)]
        var retryIndex = quickRetries.count
        var shortWaits = 0
        // Kept from an earlier acquisition, or created at the first wait past the hand-over watch.
        var sources = existingWaitSources
        if let handedOver = state.withLock({ $0.handedOver.take() }),
           directory.bell.changeCount() == handedOver.changes {
            // This process has just released on a stop request, and the requester has not
            // written its grant yet: keep off the arbiter for a moment
            // (``RoleDirectory/successorWait``). The sources made here are the ones the first
            // wait would make.
            let current = try sources ?? waitSources()
            sources = current
            try await waitForSuccessor(of: handedOver, sources: current, deadline: deadline)
        }
        if let sources {
            // Drop a delivery left over from before this call (often this process's own last
            // release): the first pass below reads the record anyway.
            _ = try? await sources.observation.next(deadline: .after(.zero))
        }
        var filesSeen: UInt64 = 0
        // Whether this acquisition has watched for the asked holder's release on its own thread
        // (``RoleDirectory/handOverWatch``): once at most.
        var watchedHandOver = false
        while true {
            if let sources { filesSeen = sources.files.events.snapshot() }
            try checkActive("acquire role \(name)")
            try Task.checkCancellation()
            let decision: Decision
            let changesSeen: UInt32
            var wroteStop = false
            handOverTrace("acquire.pass")
            do {
                (decision, changesSeen) = try await transitionOnce(priority: priority, kind: kind, options: options, deadline: deadline, wroteStop: &wroteStop)
                if wroteStop { postedStop = true }
            } catch {
                // A grant whose record could not be written is no grant.
                if state.withLock({ $0.grant == nil }) { holderLock.unlock() }
                throw error
            }
            switch decision {
            case .granted(let epoch, let previous, let replaced):
                handOverTrace("acquire.granted")
                granted = true
                // A grant of a free role changes nothing any waiter or holder waits for (no
                // grant lets another acquisition through): it rings the grants signal alone,
                // which status watchers observe, so that the waiting processes are not woken for
                // nothing while this one goes on (a wake-up that costs the poster 15-20 µs when
                // the woken thread's processor has to be woken too). A grant that replaced a
                // holder rings the role's signal: the holder it replaced (overtaken, or taken
                // over while suspended) learns of it there.
                if replaced { ring() } else { ringGrants() }
                // Outside the arbiter lock: unlinking waits for the file system's journal.
                if let previous { directory.removeIfDead(previous) }
                return epoch
            case .wait(let until, let blocker, let entitled, let byHolder):
                // Rung when this pass wrote a stop request, not on every pass after: a ring
                // wakes the holder to read the record again.
                handOverTrace("acquire.wait")
                if wroteStop { ring() }
                if deadline.hasPassed {
                    if entitled {
                        throw BatonError(.timedOut, "timed out acquiring role \(name): \(blocker) was asked to stop but did not release before the deadline; wait longer or lower the grace period")
                    }
                    throw BatonError(.busy, "role \(name) is busy: \(blocker); it cannot be acquired at priority \(priority) until that process releases or leaves")
                }
                if postedStop, entitled, byHolder, !watchedHandOver {
                    // This process asked a live holder to stop: its release will write the
                    // record, which wakes this thread (the role's signal rings as well, which
                    // this process observes only if an earlier wait of it went past this watch).
                    watchedHandOver = true
                    if directory.watchForChange(after: changesSeen, deadline: deadline, until: until) { continue }
                }
                guard let current = sources else {
                    // First wait: start listening, then look again before sleeping.
                    sources = try waitSources()
                    continue
                }
                if byHolder, retryIndex < quickRetries.count {
                    // A close was reported: the kernel drops a dying holder's lock just after.
                    try await Task.sleep(for: quickRetries[retryIndex])
                    retryIndex += 1
                    continue
                }
                var slice = deadline.earliest(.after(shortWaits > 0 ? .milliseconds(1) : options.backstopInterval))
                shortWaits = max(shortWaits - 1, 0)
                if let until {
                    let now = baton_monotonic_ns()
                    slice = slice.earliest(.after(.nanoseconds(Int64(until > now ? until - now : 0))))
                }
                var wake: Wake
                repeat {
                    wake = try await Self.waitAny(
                        observation: current.observation, files: current.files, filesSeen: filesSeen, deadline: slice)
                    handOverTrace("acquire.woke")
                    // This process's own ring (its stop request) changes nothing it waits for.
                } while isOwnRing(wake)
                if case .files = wake {
                    retryIndex = 0
                    shortWaits = 8
                } else {
                    retryIndex = quickRetries.count
                }
            }
        }
    }

    /// One pass; waits (suspended) for the arbiter lock until `deadline` at most. Returns the
    /// decision and the bell's change word as the pass left it.
    private func transitionOnce(
        priority: RolePriority, kind: String, options: RoleOptions, deadline: Deadline, wroteStop: inout Bool
    ) async throws -> (Decision, changes: UInt32) {
        try await directory.transition(waitingUntil: deadline) { transaction -> Decision in
            if state.withLock({ $0.suspended }) {
                throw BatonError(.suspended, "cannot acquire role \(name) while the process is suspended; call resume() first")
            }
            let decision = try decide(&transaction, priority: priority, kind: kind, options: options, wroteStop: &wroteStop)
            handOverTrace("pass.decided")
            if case .wait = decision {
                if !waiterLock.isLocked {
                    _ = try waiterLock.lock { RoleDirectory.writeWaiterContent(priority: priority, kind: kind, into: $0) }
                }
                let id = waiterLock.id
                if !transaction.record.waiters.contains(where: { $0.id == id }) {
                    guard transaction.record.waiters.count < RoleRecord.maximumWaiters else {
                        throw BatonError(.capacityExceeded, "\(RoleRecord.maximumWaiters) processes already wait for role \(name); this one cannot queue behind them. Retry later or use fewer processes")
                    }
                    transaction.record.waiters.append(RoleRecord.WaiterSlot(
                        id: id, pid: baton_process_id(), priority: Int64(priority.value), sinceWallNanoseconds: RoleDirectory.wallNanoseconds()))
                }
            }
            return decision
        }
    }

    private func decide(
        _ transaction: inout RoleDirectory.Transaction,
        priority: RolePriority,
        kind: String,
        options: RoleOptions,
        wroteStop: inout Bool
    ) throws -> Decision {
        let now = baton_monotonic_ns()
        let myWaiterID = waiterLock.id
        let others = try directory.liveWaiters(in: &transaction.record, excluding: myWaiterID, removeDead: true)
        if let stop = transaction.record.stop, stop.waiterID != myWaiterID, !others.contains(where: { $0.id == stop.waiterID }) {
            // The requester gave up or died.
            transaction.record.stop = nil
            if transaction.record.holder?.state == .stopping { transaction.record.holder?.state = .running }
        }
        let holder = transaction.record.holder
        let holderAlive = try holder.map { try directory.isHolderAlive($0) } ?? false
        if let higher = others.first(where: { $0.priority > priority }) {
            return .wait(until: nil, blocker: .waiter(higher), entitled: false, byHolder: false)
        }
        if holderAlive, let holder {
            if Int(holder.priority) >= priority.value {
                return .wait(until: nil, blocker: .holder(holder), entitled: false, byHolder: true)
            }
            if (transaction.record.stop?.priority ?? .min) < Int64(priority.value) {
                transaction.record.stop = RoleRecord.StopEntry(
                    waiterID: myWaiterID,
                    priority: Int64(priority.value),
                    pid: baton_process_id(),
                    requestedMonotonic: now,
                    requestedWallNanoseconds: RoleDirectory.wallNanoseconds(),
                    graceNanoseconds: UInt64(max(options.gracePeriod.nanoseconds, 0)),
                    maximumCriticalNanoseconds: UInt64(max(options.maximumCriticalWait.nanoseconds, 0)))
                if holder.state == .running { transaction.record.holder?.state = .stopping }
                wroteStop = true
            }
            let overtakeAt = transaction.record.stop!.overtakeAt(holderState: transaction.record.holder!.state)
            if now < overtakeAt {
                return .wait(until: overtakeAt, blocker: .holder(holder), entitled: true, byHolder: true)
            }
            // The holder ignored the stop request past its grace period: overtake it. Its
            // epoch is over; its token fails validation from this transition on.
            container.diagnostics.report(.roleHolderOvertaken, level: .warning, "role \(name): overtaking \(Blocker.holder(holder)), which did not release within its grace period")
        } else if let holder {
            container.diagnostics.report(.roleTakenOver, "role \(name): taking over from pid \(holder.pid) (kind \(holder.kind), epoch \(holder.epoch)), which died or was suspended holding it")
        }
        guard try holderLock.lock() else {
            throw BatonError(.corrupt, "this process's holder file of role \(name) is locked by another process; remove \(container.absolutePath(holderLock.relativePath))")
        }
        let epoch = transaction.nextEpoch()
        transaction.record.holder = RoleRecord.HolderEntry(
            epoch: epoch,
            priority: Int64(priority.value),
            pid: baton_process_id(),
            state: .running,
            kind: kind,
            sinceWallNanoseconds: RoleDirectory.wallNanoseconds(),
            criticalSinceMonotonic: 0,
            lockID: holderLock.id)
        transaction.record.stop = nil
        transaction.record.waiters.removeAll { $0.id == myWaiterID }
        return .granted(epoch: epoch, previous: holder.flatMap { $0.lockID != holderLock.id ? $0 : nil }, replaced: holder != nil)
    }

    /// Whether the wake is this process's own ring alone: a delivery that stands for one post,
    /// whose state is this process's last ring. (A delivery of several posts whose state is
    /// this process's ring also holds another process's post, made just before: a release,
    /// say, which must not be slept through.)
    private func isOwnRing(_ wake: Wake) -> Bool {
        if case .signal(let delivery, let posts) = wake { return posts == 1 && isOwnRing(delivery) }
        return false
    }

    /// After this process released the role on a stop request (``RoleCore/State/handedOver``),
    /// and before the requester's grant moved the bell's change word past that release: returns
    /// once ``RoleDirectory/successorWait`` has passed since the release, or earlier when the
    /// role's signal rings (a release, a requester giving up) or a lock file of the role's
    /// directory is closed (a death); suspended meanwhile. A wake-up that finds the change word
    /// moved (the grant, or another write of the record) ends it too.
    /// - Throws: `CancellationError` when the task is cancelled.
    private func waitForSuccessor(of handOver: HandOver, sources: WaitSources, deadline: Deadline) async throws {
        let bell = directory.bell
        handOverTrace("acquire.succ")
        successorWaits.add(1, ordering: .relaxed)
        let filesSeen = sources.files.events.snapshot()
        let end = deadline.earliest(handOver.until)
        // A delivery taken here is looked at by the first pass anyway (it reads the record).
        waiting: while bell.changeCount() == handOver.changes {
            switch try await Self.waitAny(observation: sources.observation, files: sources.files, filesSeen: filesSeen, deadline: end) {
            case .signal: continue
            case .files, .timeout: break waiting
            }
        }
        handOverTrace("acquire.succ.end")
    }

    private static func waitAny(
        observation: SignalObservation,
        files: FileEvents.Subscription,
        filesSeen: UInt64,
        deadline: Deadline
    ) async throws -> Wake {
        // One continuation for all the sources: whichever thread sees its event first (the
        // signal thread, the inotify thread, the timer) resumes the acquisition directly.
        let observer = observation.observer
        while true {
            let signalSeen = observer.arrivalCounter.snapshot()
            if let (delivery, posts) = try observer.takeCounted() { return .signal(delivery, posts: posts) }
            do {
                let index = try await EventCounter.waitAny(
                    [(observer.arrivalCounter, signalSeen), (files.events, filesSeen)], deadline: deadline)
                if index == 1 { return .files }
            } catch let error as BatonError where error.code == .timedOut {
                return .timeout
            }
        }
    }
}
