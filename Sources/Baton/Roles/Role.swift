import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization

/// A named role (`core` by default) that at most one process of a container holds at a time,
/// arbitrated by priority: the app (``RolePriority/main``) and its extensions
/// (``RolePriority/executor``) never run the shared core together, and the app gets it back at
/// once when the user opens it.
///
/// ```swift
/// let role = try container.role("core")
/// let lease = try await role.acquire(priority: .main, kind: "app", deadline: .after(.seconds(3)))
/// try database.write { db in try lease.validate(); ... }   // fenced writes
/// await lease.release()
/// ```
///
/// Rules:
/// - A lower priority cannot acquire while a higher one holds the role or waits for it; it
///   waits until its deadline, then gets `busy` naming the holder.
/// - A higher priority preempts: the holder receives a ``StopRequest`` on
///   ``RoleLease/stopRequests`` and should release. A holder inside
///   ``RoleLease/withCriticalSection(_:)`` finishes it first (bounded by the requester's
///   ``RoleOptions/maximumCriticalWait``); one that ignores the request past the requester's
///   ``RoleOptions/gracePeriod`` is overtaken: the epoch moves on and its token is fenced.
/// - A holder that dies frees the role at once: the kernel drops its lock file's `flock`, and the
///   close wakes the waiters (no heartbeat, no timeout).
/// - The tasks of one process are served in order; ``join(priority:kind:deadline:)`` shares the
///   grant the process already holds.
///
/// Latency: a preemption is two cross-process wake-ups (the stop request, the release). The
/// acquiring thread waits for the release itself for a short while after it asks (a quarter of a
/// millisecond), so a prompt release wakes it directly on any executor. The stop request
/// reaches the holder on the signal thread: run the code that handles
/// ``RoleLease/stopRequests`` (and the code that acquires) inside
/// `withTaskExecutorPreference(container.signals.executor) { ... }` where it matters, so that it
/// resumes on the thread that saw the request instead of also waking a pool thread.
///
/// A role is a ``SuspensionParticipant``: ``suspend()`` releases every kernel lock the role
/// holds in this process (the container's ``SharedContainer/suspend()`` does it for every role);
/// ``resume()`` takes the grant back or throws `lost` with the new epoch.
public final class Role: SuspensionParticipant {
    let core: RoleCore
    /// How this process arbitrates.
    public let options: RoleOptions

    /// The role's name.
    public var name: String { core.name }

    /// The container the role lives in.
    public var container: SharedContainer { core.container }

    /// Opens the role `name` of `container` (its files live in `.baton/roles/<name>/`).
    /// - Parameters:
    ///   - container: The shared container.
    ///   - name: The role's name: 1 to 100 bytes, a plain file name.
    ///   - options: Grace period and critical-section bound used when this process preempts.
    /// - Throws: `invalidName`, `invalidArgument` for negative durations, file-system errors.
    public init(_ container: SharedContainer, name: String = "core", options: RoleOptions = RoleOptions()) throws {
        try SharedContainer.validateName(name, what: "a role name", maxBytes: 100)
        guard options.gracePeriod >= .zero, options.maximumCriticalWait >= .zero, options.backstopInterval > .zero else {
            throw BatonError(.invalidArgument, "role options must have a non-negative grace period and critical wait and a positive backstop interval")
        }
        self.core = try RoleCore.shared(container: container, name: name)
        self.options = options
    }

    /// Acquires the role for this process.
    ///
    /// Tasks of one process are served in order: while another task of this process holds the
    /// role (or is acquiring it), this waits for its release; use
    /// ``join(priority:kind:deadline:)`` to share that grant instead.
    ///
    /// - Parameters:
    ///   - priority: ``RolePriority/main`` for the app, ``RolePriority/executor`` for an
    ///     extension, or any level.
    ///   - kind: What this process is, shown in the role's status (1 to 64 bytes).
    ///   - deadline: When to give up.
    /// - Returns: The lease, with a new epoch.
    /// - Throws: `busy` (naming the holder or the higher waiter) when the rules forbid this
    ///   priority to take the role before the deadline; `timedOut` when a lower-priority holder
    ///   was asked to stop but neither released nor reached the end of its grace period before
    ///   the deadline; `suspended`; `CancellationError`; `invalidArgument` for a bad kind.
    public func acquire(priority: RolePriority, kind: String = "process", deadline: Deadline) async throws -> RoleLease {
        try Self.validateKind(kind)
        _ = try await core.takeTurn(joining: false, deadline: deadline)
        return try await acquireHoldingTurn(priority: priority, kind: kind, deadline: deadline)
    }

    /// Joins the grant this process already holds (another extension instance running as a
    /// thread of the same process), or acquires the role for the process when it holds none.
    ///
    /// Every joined lease shares the grant's epoch and priority; the role is released across
    /// processes when the last of them is released.
    /// - Parameters:
    ///   - priority: The priority to acquire at when the process holds no grant yet.
    ///   - kind: What this process is, when it acquires.
    ///   - deadline: When to give up.
    /// - Returns: A lease of the process's grant.
    /// - Throws: As ``acquire(priority:kind:deadline:)``.
    public func join(priority: RolePriority, kind: String = "process", deadline: Deadline) async throws -> RoleLease {
        try Self.validateKind(kind)
        if let epoch = try await core.takeTurn(joining: true, deadline: deadline) {
            let grant = core.state.withLock { $0.grant }
            return RoleLease(core: core, epoch: epoch, priority: grant?.priority ?? priority, kind: grant?.kind ?? kind)
        }
        return try await acquireHoldingTurn(priority: priority, kind: kind, deadline: deadline)
    }

    private func acquireHoldingTurn(priority: RolePriority, kind: String, deadline: Deadline) async throws -> RoleLease {
        do {
            let epoch = try await core.acquireAcrossProcesses(priority: priority, kind: kind, options: options, deadline: deadline)
            core.installGrant(RoleCore.Grant(epoch: epoch, priority: priority, kind: kind, members: 1, criticalDepth: 0))
            return RoleLease(core: core, epoch: epoch, priority: priority, kind: kind)
        } catch {
            core.giveTurnBack()
            throw error
        }
    }

    private static func validateKind(_ kind: String) throws {
        let count = kind.utf8.count
        guard count >= 1, count <= RoleRecord.maximumKindBytes, !kind.utf8.contains(0), !kind.utf8.contains(10) else {
            throw BatonError(.invalidArgument, "a role holder's kind must be 1 to \(RoleRecord.maximumKindBytes) bytes of UTF-8 without NUL or newline; this one is \(count) bytes")
        }
    }

    /// The role now: holder, state, waiters, last epoch.
    /// - Throws: File-system errors.
    public func status() throws -> RoleStatus {
        try core.directory.read { record in
            var holder: RoleStatus.Holder?
            if let entry = record.holder, try core.directory.isHolderAlive(entry) {
                let stop = record.stop.map { stop in
                    StopRequest(
                        priority: RolePriority(Int(stop.priority)),
                        pid: stop.pid,
                        deadline: Self.date(stop.deadlineWallNanoseconds(holderState: entry.state)))
                }
                holder = RoleStatus.Holder(
                    priority: RolePriority(Int(entry.priority)),
                    kind: entry.kind,
                    pid: entry.pid,
                    epoch: entry.epoch,
                    state: entry.state,
                    since: Self.date(entry.sinceWallNanoseconds),
                    stopRequest: stop)
            }
            var snapshot = record
            let waiters = try core.directory.liveWaiters(in: &snapshot, removeDead: false, kinds: true).map {
                RoleStatus.Waiter(priority: $0.priority, kind: $0.kind, pid: $0.pid, since: Self.date($0.sinceWallNanoseconds))
            }
            return RoleStatus(
                name: name,
                holder: holder,
                waiters: waiters,
                epoch: record.lastEpoch,
                heartbeat: record.heartbeatWallNanoseconds == 0 ? nil : Self.date(record.heartbeatWallNanoseconds))
        }
    }

    static func date(_ nanoseconds: Int64) -> Date { Date(timeIntervalSince1970: Double(nanoseconds) / 1e9) }

    /// The role's status now, then each time it changes (grants, releases, stop requests,
    /// critical sections, waiters coming and going, a holder dying). Driven by the role's signal
    /// and the kernel's close events; no polling.
    public func statusChanges() -> RoleStatusChanges { RoleStatusChanges(role: self) }

    /// Releases every kernel lock this role holds in this process.
    public func suspend() async { core.suspend(by: core.ownSuspensionID) }

    /// Takes this process's grant back.
    /// - Throws: `lost` with the new epoch when another process took the role meanwhile.
    public func resume() async throws { try core.resume(by: core.ownSuspensionID) }
}

/// A role's status, then one element per change, as an `AsyncSequence`. Iterate from one task;
/// cancel it to stop.
public struct RoleStatusChanges: AsyncSequence, Sendable {
    public typealias Element = RoleStatus
    let role: Role

    public func makeAsyncIterator() -> Iterator { Iterator(role: role) }

    /// Iterates status snapshots.
    public struct Iterator: AsyncIteratorProtocol {
        let role: Role
        /// The role's signal and its grants signal (a grant of a free role rings only the
        /// latter: see `RoleCore.ringGrants()`).
        var observations: [SignalObservation] = []
        var files: FileEvents.Subscription?
        var last: RoleStatus?

        /// The next changed status; `nil` when the task is cancelled.
        /// - Throws: File-system errors.
        public mutating func next() async throws -> RoleStatus? {
            let core = role.core
            if observations.isEmpty {
                observations = [
                    try core.container.signals.observe(core.signalName),
                    try core.container.signals.observe(core.grantsSignalName),
                ]
                files = try FileEvents.shared.subscribe(path: core.container.absolutePath(core.directory.path), interest: .writerGoneInDirectory)
            }
            guard let files else { return nil }
            let observers = observations.map(\.observer)
            while !Task.isCancelled {
                let seen = files.events.snapshot()
                let signalsSeen = observers.map { ($0.arrivalCounter, $0.arrivalCounter.snapshot()) }
                // The status read below covers any delivery pending now.
                do { for observer in observers { _ = try observer.take() } } catch { return nil }
                let status = try role.status()
                if status != last {
                    last = status
                    return status
                }
                do {
                    _ = try await EventCounter.waitAny(signalsSeen + [(files.events, seen)], deadline: .after(.seconds(1)))
                } catch let error as BatonError where error.code == .timedOut {
                    continue
                } catch is CancellationError {
                    return nil
                }
            }
            return nil
        }
    }
}
