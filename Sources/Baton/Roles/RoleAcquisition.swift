#if canImport(FoundationEssentials)
import CBatonShims
import FoundationEssentials
#else
import Foundation
#endif

/// Acquiring a role across processes: the waiting loop of one process's request.
///
/// Each pass is one transition under the arbiter lock that either grants the role (a new epoch
/// and a freshly locked holder file), or records why the process must wait: a higher priority
/// waits or holds, or this process asked a lower-priority holder to stop and its grace period
/// (or the bound on its critical section) has not run out. Between passes the process sleeps
/// until the role's signal rings (releases, stop requests, critical sections), a lock file in
/// the role's directory is closed (a holder or waiter died: the kernel's word, no heartbeat),
/// this process suspends, the grace period ends, or the deadline passes.
extension RoleCore {
    private enum Decision {
        case granted(epoch: UInt64, fd: Int32, previous: UInt64?)
        case wait(until: UInt64?, blocker: String, entitled: Bool, byHolder: Bool)
    }

    private enum Wake: Sendable { case signal, files, process, timeout }

    /// Acquires the role for this process (the caller holds the process's turn).
    /// - Returns: The epoch granted and the holder file's descriptor.
    func acquireAcrossProcesses(
        priority: RolePriority,
        kind: String,
        options: RoleOptions,
        deadline: Deadline
    ) async throws -> (epoch: UInt64, fd: Int32) {
        try container.suspension.checkActive("acquire role \(name)")
        let signals = try container.signals
        let observation = try signals.observe(signalName)
        defer { observation.cancel() }
        let files = try FileEvents.shared.subscribe(path: container.absolutePath(directory.path), mask: FileEvents.roleDirectoryEvents)
        let waiterID = UInt64.random(in: 1...UInt64.max)
        var createdWaiter = false
        var postedStop = false
        var granted = false
        defer {
            closeWaiterFD(waiterID)
            if createdWaiter { directory.removeFile(directory.waiterFile(waiterID)) }
            if postedStop && !granted && !container.suspension.isSuspended {
                _ = try? directory.transition { transaction in
                    guard transaction.record.stop?.waiterID == waiterID else { return }
                    transaction.record.stop = nil
                    if transaction.record.holder?.state == .stopping { transaction.record.holder?.state = .running }
                }
            }
            if createdWaiter { try? signals.post(signalName) }
        }
        let quickRetries: [Duration] = [.microseconds(20), .microseconds(100), .microseconds(500), .milliseconds(2), .milliseconds(8)]
        var retryIndex = quickRetries.count
        while true {
            let filesSeen = files.events.snapshot()
            let processSeen = turnChanges.snapshot()
            try container.suspension.checkActive("acquire role \(name)")
            try Task.checkCancellation()
            var createdFD: Int32 = -1
            let decision: Decision
            do {
                decision = try directory.transition { transaction -> Decision in
                    if !hasWaiterFD(waiterID) {
                        if createdWaiter {
                            throw BatonError(.suspended, "acquiring role \(name) was interrupted by a suspension; acquire again after resume()")
                        }
                        let fd = try directory.createWaiterFile(waiterID, priority: priority, kind: kind)
                        createdWaiter = true
                        guard registerWaiterFD(waiterID, fd) else {
                            Sys.close(fd)
                            throw BatonError(.suspended, "cannot acquire role \(name) while the process is suspended; call resume() first")
                        }
                    }
                    return try decide(&transaction, waiterID: waiterID, priority: priority, kind: kind, options: options,
                                      postedStop: &postedStop, createdFD: &createdFD)
                }
            } catch {
                if createdFD >= 0 { Sys.close(createdFD) }
                throw error
            }
            switch decision {
            case .granted(let epoch, let fd, let previous):
                granted = true
                if let previous { directory.removeFile(directory.holderFile(previous)) }
                try? signals.post(signalName)
                return (epoch, fd)
            case .wait(let until, let blocker, let entitled, let byHolder):
                if postedStop { try? signals.post(signalName) }
                if deadline.hasPassed {
                    if entitled {
                        throw BatonError(.timedOut, "timed out acquiring role \(name): \(blocker) was asked to stop but did not release before the deadline; wait longer or lower the grace period")
                    }
                    throw BatonError(.busy, "role \(name) is busy: \(blocker); it cannot be acquired at priority \(priority) until that process releases or leaves")
                }
                if byHolder, retryIndex < quickRetries.count {
                    // A close was reported: the kernel drops a dying holder's lock just after.
                    try await Task.sleep(for: quickRetries[retryIndex])
                    retryIndex += 1
                    continue
                }
                var slice = deadline.earliest(.after(options.backstopInterval))
                if let until {
                    let now = baton_monotonic_ns()
                    slice = slice.earliest(.after(.nanoseconds(Int64(until > now ? until - now : 0))))
                }
                let wake = try await Self.waitAny(
                    observation: observation, files: files, filesSeen: filesSeen,
                    process: turnChanges, processSeen: processSeen, deadline: slice)
                retryIndex = wake == .files ? 0 : quickRetries.count
            }
        }
    }

    private func decide(
        _ transaction: inout RoleDirectory.Transaction,
        waiterID: UInt64,
        priority: RolePriority,
        kind: String,
        options: RoleOptions,
        postedStop: inout Bool,
        createdFD: inout Int32
    ) throws -> Decision {
        let now = baton_monotonic_ns()
        let others = try directory.liveWaiters(removeDead: true).filter { $0.id != waiterID }
        if let stop = transaction.record.stop, stop.waiterID != waiterID, !others.contains(where: { $0.id == stop.waiterID }) {
            // The requester gave up or died.
            transaction.record.stop = nil
            if transaction.record.holder?.state == .stopping { transaction.record.holder?.state = .running }
        }
        let holder = transaction.record.holder
        let holderAlive = try holder.map { try directory.isHolderAlive($0.epoch) } ?? false
        if let higher = others.first(where: { $0.priority > priority }) {
            return .wait(until: nil, blocker: "a process of priority \(higher.priority) (pid \(higher.pid), kind \(higher.kind)) is waiting for it", entitled: false, byHolder: false)
        }
        if holderAlive, let holder {
            let description = "held by priority \(RolePriority(Int(holder.priority))) (pid \(holder.pid), kind \(holder.kind), epoch \(holder.epoch), \(holder.state.rawValue))"
            if Int(holder.priority) >= priority.value {
                return .wait(until: nil, blocker: description, entitled: false, byHolder: true)
            }
            if (transaction.record.stop?.priority ?? .min) < Int64(priority.value) {
                transaction.record.stop = RoleRecord.StopEntry(
                    waiterID: waiterID,
                    priority: Int64(priority.value),
                    pid: getpid(),
                    requestedMonotonic: now,
                    requestedWallNanoseconds: RoleDirectory.wallNanoseconds(),
                    graceNanoseconds: UInt64(max(options.gracePeriod.nanoseconds, 0)),
                    maximumCriticalNanoseconds: UInt64(max(options.maximumCriticalWait.nanoseconds, 0)))
                if holder.state == .running { transaction.record.holder?.state = .stopping }
                postedStop = true
            }
            let overtakeAt = transaction.record.stop!.overtakeAt(holderState: transaction.record.holder!.state)
            if now < overtakeAt {
                return .wait(until: overtakeAt, blocker: description, entitled: true, byHolder: true)
            }
            // The holder ignored the stop request past its grace period: overtake it. Its
            // epoch is over; its token fails validation from this transition on.
        }
        let epoch = transaction.nextEpoch()
        createdFD = try directory.createHolderFile(epoch)
        transaction.record.holder = RoleRecord.HolderEntry(
            epoch: epoch,
            priority: Int64(priority.value),
            pid: getpid(),
            state: .running,
            kind: kind,
            sinceWallNanoseconds: RoleDirectory.wallNanoseconds(),
            criticalSinceMonotonic: 0)
        transaction.record.stop = nil
        return .granted(epoch: epoch, fd: createdFD, previous: holder?.epoch)
    }

    private static func waitAny(
        observation: SignalObservation,
        files: FileEvents.Subscription,
        filesSeen: UInt64,
        process: EventCounter,
        processSeen: UInt64,
        deadline: Deadline
    ) async throws -> Wake {
        try await withThrowingTaskGroup(of: Wake.self) { group in
            group.addTask {
                do { _ = try await observation.next(deadline: deadline); return .signal }
                catch let error as BatonError where error.code == .timedOut { return .timeout }
            }
            group.addTask {
                do { try await files.events.wait(after: filesSeen, deadline: deadline); return .files }
                catch let error as BatonError where error.code == .timedOut { return .timeout }
            }
            group.addTask {
                do { try await process.wait(after: processSeen, deadline: deadline); return .process }
                catch let error as BatonError where error.code == .timedOut { return .timeout }
            }
            defer { group.cancelAll() }
            return try await group.next() ?? .timeout
        }
    }
}
