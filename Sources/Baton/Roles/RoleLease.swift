import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization

/// A grant of a ``Role``: a fencing token, the stop requests addressed to its holder, and
/// critical sections.
///
/// ```swift
/// let lease = try await role.acquire(priority: .executor, deadline: .after(.seconds(5)))
/// defer { Task { await lease.release() } }
/// for await request in lease.stopRequests {       // the app wants the core back
///     try await lease.withCriticalSection { try await finishPayment() }
///     break
/// }
/// await lease.release()
/// ```
///
/// Shared writes made under the role check the token inside their own transaction
/// (``validate()``): once a higher priority overtook this holder, or took the role while this
/// process was suspended, the token is stale and every write is refused with `fenced`.
///
/// Several leases of one process may share one grant (``Role/join(priority:kind:deadline:)``);
/// the role is released across processes when the last of them is released. A lease that is
/// neither released nor kept alive is released on deinit.
///
/// A lease is a ``SuspensionParticipant`` through its role: ``suspend()`` and ``resume()``
/// act on the process's grant, like the container's own suspension.
public final class RoleLease: Fence, SuspensionParticipant {
    let core: RoleCore
    /// The role's name: the scope of this fencing token.
    public let scope: String
    /// The fencing token: unique to this grant, larger than every earlier grant of the role.
    public let epoch: UInt64
    /// The priority the role was granted at.
    public let priority: RolePriority
    /// What the holding process said it is (`app`, `extension`, ...).
    public let kind: String
    private let released = Mutex(false)

    init(core: RoleCore, epoch: UInt64, priority: RolePriority, kind: String) {
        self.core = core
        self.scope = core.name
        self.epoch = epoch
        self.priority = priority
        self.kind = kind
    }

    deinit { leave() }

    /// Requests from higher priorities that this holder stops: who asks and by when. The
    /// sequence ends when the lease is released, overtaken or lost.
    public var stopRequests: StopRequests { StopRequests(core: core, epoch: epoch) }

    /// Whether the lease is still the role's current grant: not released, not suspended, and
    /// the role's record still names its epoch (read now, so this costs a file read).
    public var isValid: Bool { (try? validate()) != nil }

    /// Checks the token against the role's record: call it inside the transaction of every
    /// shared write made under the role.
    /// - Throws: `fenced` naming the current epoch when a newer grant exists or the lease was
    ///   released; `suspended` while the process is suspended.
    public func validate() throws {
        if released.withLock({ $0 }) { throw core.fencedError(epoch, current: nil) }
        try core.validate(epoch)
    }

    /// Runs `body` as a critical section: a higher priority that asks for the role waits until
    /// it ends (bounded by its ``RoleOptions/maximumCriticalWait``), and the role's status shows
    /// `critical` meanwhile. Sections of the leases of one process nest. When the section ends
    /// while a stop request is pending, the requester's grace period starts again, so the holder
    /// can release cleanly. A section cannot start once a stop was requested.
    /// - Throws: `stopRequested` when a higher priority already asked for the role; `fenced` when
    ///   the lease is no longer current; `suspended`; or what `body` throws.
    public func withCriticalSection<R>(_ body: () async throws -> R) async throws -> R {
        if released.withLock({ $0 }) { throw core.fencedError(epoch, current: nil) }
        try core.enterCritical(epoch)
        defer { core.leaveCritical(epoch) }
        return try await body()
    }

    /// Releases this lease; when it is the last lease of the process's grant, the role is
    /// released across processes (waiters are woken at once). Safe to call more than once.
    public func release() async { leave() }

    private func leave() {
        let first = released.withLock { released -> Bool in
            defer { released = true }
            return !released
        }
        if first { core.leave(epoch) }
    }

    /// Releases every kernel lock of this process's grant of the role (like the container's
    /// suspension does).
    public func suspend() async { core.suspend(by: core.ownSuspensionID) }

    /// Takes the grant back if nobody took the role meanwhile (once every suspension of the
    /// role in this process has ended).
    /// - Throws: `lost` naming the new epoch when another process took the role.
    public func resume() async throws {
        try core.resume(by: core.ownSuspensionID)
        if core.state.withLock({ $0.grant?.epoch != epoch }), !released.withLock({ $0 }) {
            throw BatonError(.lost, "the lease of role \(scope) with epoch \(epoch) was lost; the current epoch is \(core.lostReplacement(of: epoch).map(String.init) ?? "unknown")")
        }
    }
}

/// The stop requests addressed to one lease, as an `AsyncSequence`. Each request is delivered
/// once per iterator; the sequence ends when the lease is released, overtaken or lost. Driven by
/// the role's signal; no polling. Iterate from one task.
public struct StopRequests: AsyncSequence, Sendable {
    public typealias Element = StopRequest
    let core: RoleCore
    let epoch: UInt64

    public func makeAsyncIterator() -> Iterator { Iterator(core: core, epoch: epoch) }

    /// Iterates stop requests.
    public struct Iterator: AsyncIteratorProtocol {
        let core: RoleCore
        let epoch: UInt64
        var observation: SignalObservation?
        var delivered: Set<StopRequest> = []

        /// The next stop request; `nil` when the lease ended or the task was cancelled.
        public mutating func next() async -> StopRequest? {
            if observation == nil {
                observation = try? core.container.signals.observe(core.signalName)
            }
            guard let observation else { return nil }
            while !Task.isCancelled {
                enum Look { case ended, request(StopRequest), nothing }
                let look: Look
                let held = core.state.withLock { $0.grant?.epoch == epoch }
                if !held {
                    look = .ended
                } else {
                    let epoch = self.epoch
                    let read = try? core.directory.read { record -> Look in
                        guard let holder = record.holder, holder.epoch == epoch, holder.pid == baton_process_id() else {
                            if !core.state.withLock({ $0.suspended }) { return .ended }
                            return .nothing
                        }
                        guard let stop = record.stop else { return .nothing }
                        let deadlineNanoseconds = stop.deadlineWallNanoseconds(holderState: holder.state)
                        return .request(StopRequest(
                            priority: RolePriority(Int(stop.priority)),
                            pid: stop.pid,
                            deadline: Date(timeIntervalSince1970: Double(deadlineNanoseconds) / 1e9)))
                    }
                    look = read ?? .nothing
                }
                switch look {
                case .ended:
                    if let current = try? core.directory.read({ $0.holder?.epoch ?? $0.lastEpoch }), current != epoch,
                       core.state.withLock({ $0.grant?.epoch == epoch }) {
                        core.markLost(epoch, current: current)
                    }
                    observation.cancel()
                    return nil
                case .request(let request):
                    let key = StopRequest(priority: request.priority, pid: request.pid, deadline: Date(timeIntervalSince1970: 0))
                    if delivered.insert(key).inserted {
                        handOverTrace("stopreq.found")
                        return request
                    }
                case .nothing:
                    break
                }
                // Every change that matters rings the signal (stop requests, releases, grants,
                // this process's suspension); no timer needed.
                do {
                    _ = try await observation.next(deadline: .never)
                    handOverTrace("stopreq.woke")
                } catch {
                    return nil
                }
            }
            return nil
        }
    }
}
