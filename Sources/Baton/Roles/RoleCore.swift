#if canImport(FoundationEssentials)
import CBatonShims
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization

/// The process-wide side of one role in one container: the single cross-process grant this
/// process may hold, shared by every ``RoleLease`` that joined it, and the in-process queue of
/// tasks that ask for it. Every ``Role`` object of the same container and name in a process
/// shares one core, so the extension instances that iOS runs as threads of one process are
/// served in order and can join one lease.
///
/// The core is the role's ``SuspensionParticipant``: ``suspend()`` closes the holder's and every
/// waiter's lock file; ``resume()`` locks the holder file again if the record still names this
/// process's epoch, or marks the grant lost.
final class RoleCore: Sendable {
    let directory: RoleDirectory
    let container: SharedContainer
    let name: String
    var signalName: String { "baton.role." + name }

    /// The cross-process grant this process holds.
    struct Grant: Sendable {
        var epoch: UInt64
        var priority: RolePriority
        var kind: String
        /// The holder file's descriptor; -1 while suspended.
        var fd: Int32
        /// Leases sharing the grant.
        var members: Int
        /// Nested critical sections in the process.
        var criticalDepth: Int
    }

    struct State {
        var grant: Grant?
        /// Set while a task of this process acquires or the grant exists: the process's turn.
        var turnTaken = false
        /// Tickets of tasks waiting for the turn, in arrival order.
        var tickets: [UInt64] = []
        var nextTicket: UInt64 = 0
        /// Waiter files of acquisitions in flight, closed on suspension.
        var waiterFDs: [UInt64: Int32] = [:]
        var suspended = false
        /// Epochs this process held and lost (overtaken, or taken while suspended), with the
        /// epoch that replaced them, for error messages.
        var lost: [UInt64: UInt64] = [:]
        var token: SuspensionController.RegistrationToken?
    }

    let state = Mutex(State())
    /// Moves when the turn or the grant changes in this process.
    let turnChanges = EventCounter()

    private init(container: SharedContainer, name: String) throws {
        self.container = container
        self.name = name
        self.directory = try RoleDirectory(container: container, name: name)
    }

    deinit {
        let (grant, token, waiters) = state.withLock { ($0.grant, $0.token, $0.waiterFDs) }
        if let token { container.suspension.unregister(token) }
        if let grant, grant.fd >= 0 { Sys.close(grant.fd) }
        for fd in waiters.values { Sys.close(fd) }
    }

    // MARK: Registry

    private final class WeakCore: Sendable {
        weak let core: RoleCore?
        init(_ core: RoleCore) { self.core = core }
    }

    private static let registry = Mutex<[String: WeakCore]>([:])

    /// The core of `name` in `container` for this process.
    static func shared(container: SharedContainer, name: String) throws -> RoleCore {
        let info = try Sys.fstat(container.directory).get("checking \(container.batonPath)")
        let key = "\(info.st_dev):\(info.st_ino):\(name)"
        return try registry.withLock { registry in
            if let core = registry[key]?.core { return core }
            let core = try RoleCore(container: container, name: name)
            let token = container.suspension.register(SuspensionForwarder(core))
            core.state.withLock { $0.token = token }
            registry[key] = WeakCore(core)
            registry = registry.filter { $0.value.core != nil }
            return core
        }
    }

    private final class SuspensionForwarder: SuspensionParticipant {
        weak let core: RoleCore?
        init(_ core: RoleCore) { self.core = core }
        func suspend() async { core?.suspend() }
        func resume() async throws { try core?.resume() }
    }

    // MARK: The process's turn

    /// Waits for the process's turn (FIFO among the tasks of this process), or — when `joining`
    /// — for a grant to join. Returns the epoch joined, or `nil` when the turn was taken.
    func takeTurn(joining: Bool, deadline: Deadline) async throws -> UInt64? {
        let ticket = state.withLock { state -> UInt64 in
            state.nextTicket &+= 1
            state.tickets.append(state.nextTicket)
            return state.nextTicket
        }
        do {
            while true {
                let seen = turnChanges.snapshot()
                let outcome = state.withLock { state -> UInt64?? in
                    if joining, !state.suspended, var grant = state.grant {
                        grant.members += 1
                        state.grant = grant
                        state.tickets.removeAll { $0 == ticket }
                        return .some(grant.epoch)
                    }
                    if !state.turnTaken, state.tickets.first == ticket {
                        state.turnTaken = true
                        state.tickets.removeFirst()
                        return .some(nil)
                    }
                    return .none
                }
                if let outcome {
                    if outcome != nil { turnChanges.notify() }
                    return outcome
                }
                do {
                    try await turnChanges.wait(after: seen, deadline: deadline)
                } catch let error as BatonError where error.code == .timedOut {
                    throw BatonError(.busy, "role \(name) is held or being acquired by another task of this process (pid \(getpid())); join its lease with join(priority:kind:deadline:) or wait longer")
                }
            }
        } catch {
            state.withLock { $0.tickets.removeAll { $0 == ticket } }
            turnChanges.notify()
            throw error
        }
    }

    /// Gives the turn back after a failed acquisition.
    func giveTurnBack() {
        state.withLock { $0.turnTaken = false }
        turnChanges.notify()
    }

    // MARK: Grant bookkeeping

    /// Records a fresh grant (the caller holds the turn).
    func installGrant(_ grant: Grant) {
        state.withLock { $0.grant = grant }
        turnChanges.notify()
    }

    /// Whether this process's grant of `epoch` is current in-process (not released, lost or
    /// suspended).
    func grantIsActive(_ epoch: UInt64) -> Bool {
        state.withLock { $0.grant?.epoch == epoch && !$0.suspended }
    }

    func lostReplacement(of epoch: UInt64) -> UInt64? {
        state.withLock { $0.lost[epoch] }
    }

    /// Forgets the grant of `epoch` after it was lost (replaced by `current`): closes its holder
    /// file and frees the process's turn. Its leases stay invalid.
    func markLost(_ epoch: UInt64, current: UInt64) {
        let fd = state.withLock { state -> Int32? in
            guard let grant = state.grant, grant.epoch == epoch else { return nil }
            state.grant = nil
            state.turnTaken = false
            state.lost[epoch] = current
            return grant.fd
        }
        guard let fd else { return }
        if fd >= 0 { Sys.close(fd) }
        turnChanges.notify()
        try? container.signals.post(signalName)
    }

    /// One lease of `epoch` leaves; the last one releases the role across processes.
    func leave(_ epoch: UInt64) {
        let released = state.withLock { state -> Grant? in
            guard var grant = state.grant, grant.epoch == epoch else { return nil }
            grant.members -= 1
            if grant.members > 0 {
                state.grant = grant
                return nil
            }
            state.grant = nil
            return grant
        }
        guard let grant = released else { return }
        let suspended = state.withLock { $0.suspended }
        if !suspended {
            // Nothing may be locked while suspended: the record then still names this epoch,
            // but its holder file is unlocked, so others see the role as free.
            _ = try? directory.transition { transaction in
                if transaction.record.holder?.epoch == epoch, transaction.record.holder?.pid == getpid() {
                    transaction.record.holder = nil
                    transaction.record.stop = nil
                    directory.removeFile(directory.holderFile(epoch))
                }
            }
        }
        if grant.fd >= 0 { Sys.close(grant.fd) }
        state.withLock { $0.turnTaken = false }
        turnChanges.notify()
        try? container.signals.post(signalName)
    }

    // MARK: Critical sections

    /// Enters a critical section of the grant of `epoch`.
    func enterCritical(_ epoch: UInt64) throws {
        try container.suspension.checkActive("enter a critical section of role \(name)")
        let first = state.withLock { state -> Bool in
            guard var grant = state.grant, grant.epoch == epoch else { return false }
            grant.criticalDepth += 1
            state.grant = grant
            return grant.criticalDepth == 1
        }
        guard first else {
            if grantIsActive(epoch) { return }
            throw fencedError(epoch, current: lostReplacement(of: epoch))
        }
        do {
            try directory.transition { transaction in
                guard var holder = transaction.record.holder, holder.epoch == epoch, holder.pid == getpid() else {
                    throw fencedError(epoch, current: transaction.record.holder?.epoch ?? transaction.record.lastEpoch)
                }
                holder.state = .critical
                holder.criticalSinceMonotonic = baton_monotonic_ns()
                transaction.record.holder = holder
            }
        } catch {
            state.withLock { state in
                if var grant = state.grant, grant.epoch == epoch {
                    grant.criticalDepth -= 1
                    state.grant = grant
                }
            }
            throw error
        }
        try? container.signals.post(signalName)
    }

    /// Leaves a critical section.
    func leaveCritical(_ epoch: UInt64) {
        let last = state.withLock { state -> Bool in
            guard var grant = state.grant, grant.epoch == epoch else { return false }
            grant.criticalDepth -= 1
            state.grant = grant
            return grant.criticalDepth == 0 && !state.suspended
        }
        guard last else { return }
        _ = try? directory.transition { transaction in
            guard var holder = transaction.record.holder, holder.epoch == epoch, holder.pid == getpid() else { return }
            holder.state = transaction.record.stop == nil ? .running : .stopping
            holder.criticalSinceMonotonic = 0
            transaction.record.holder = holder
        }
        try? container.signals.post(signalName)
    }

    // MARK: Fencing

    /// Throws unless the record names `epoch` as its live holder.
    func validate(_ epoch: UInt64) throws {
        let (active, suspended) = state.withLock { ($0.grant?.epoch == epoch, $0.suspended) }
        if !active {
            throw fencedError(epoch, current: lostReplacement(of: epoch))
        }
        if suspended {
            throw BatonError(.suspended, "the lease of role \(name) (epoch \(epoch)) is suspended with the process; call resume() before writing")
        }
        let current = try directory.read { record -> UInt64? in
            if let holder = record.holder, holder.epoch == epoch, holder.pid == getpid() { return nil }
            return record.holder?.epoch ?? record.lastEpoch
        }
        if let current {
            markLost(epoch, current: current)
            throw fencedError(epoch, current: current)
        }
    }

    func fencedError(_ epoch: UInt64, current: UInt64?) -> BatonError {
        if let current, current != epoch {
            return BatonError(.fenced, "the lease of role \(name) with epoch \(epoch) is stale: the current epoch is \(current); stop writing shared state and acquire the role again")
        }
        return BatonError(.fenced, "the lease of role \(name) with epoch \(epoch) was released; acquire the role again before writing")
    }

    // MARK: Suspension

    func suspend() {
        let (fds, hadGrant) = state.withLock { state -> ([Int32], Bool) in
            state.suspended = true
            var fds = Array(state.waiterFDs.values)
            state.waiterFDs.removeAll()
            if var grant = state.grant, grant.fd >= 0 {
                fds.append(grant.fd)
                grant.fd = -1
                state.grant = grant
            }
            return (fds, state.grant != nil)
        }
        for fd in fds { Sys.close(fd) }
        turnChanges.notify()
        if hadGrant { try? container.signals.post(signalName) }
    }

    func resume() throws {
        let grant = state.withLock { state -> Grant? in
            state.suspended = false
            return state.grant
        }
        defer { turnChanges.notify() }
        guard let grant, grant.fd < 0 else { return }
        let outcome = try directory.transition { transaction -> Result<Int32, BatonError> in
            let record = transaction.record
            if let holder = record.holder, holder.epoch == grant.epoch, holder.pid == getpid(),
               let fd = try directory.relockHolderFile(grant.epoch) {
                return .success(fd)
            }
            let current = record.holder?.epoch ?? record.lastEpoch
            return .failure(BatonError(.lost, "role \(name) was taken while this process was suspended: the current epoch is \(current), this lease had epoch \(grant.epoch); acquire it again"))
        }
        switch outcome {
        case .success(let fd):
            let kept = state.withLock { state -> Bool in
                guard var current = state.grant, current.epoch == grant.epoch, !state.suspended else { return false }
                current.fd = fd
                state.grant = current
                return true
            }
            if !kept { Sys.close(fd) }
        case .failure(let error):
            let current = directory.name.isEmpty ? 0 : ((try? directory.read { $0.holder?.epoch ?? $0.lastEpoch }) ?? 0)
            markLost(grant.epoch, current: current)
            throw error
        }
    }

    // MARK: Waiter files

    func registerWaiterFD(_ id: UInt64, _ fd: Int32) -> Bool {
        state.withLock { state in
            guard !state.suspended else { return false }
            state.waiterFDs[id] = fd
            return true
        }
    }

    /// Closes the waiter file of `id` if suspension has not already; returns whether it did.
    func closeWaiterFD(_ id: UInt64) {
        let fd = state.withLock { $0.waiterFDs.removeValue(forKey: id) }
        if let fd { Sys.close(fd) }
    }

    func hasWaiterFD(_ id: UInt64) -> Bool { state.withLock { $0.waiterFDs[id] != nil } }
}
