import CBatonShims
#if canImport(FoundationEssentials)
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
/// The core is the role's ``SuspensionParticipant``: ``suspend()`` closes this process's holder
/// and waiter lock files; ``resume()`` locks the holder file again if the record still names this
/// process's epoch, or marks the grant lost.
final class RoleCore: Sendable {
    let directory: RoleDirectory
    let container: SharedContainer
    let name: String
    var signalName: String { "baton.role." + name }
    /// Rung by a grant of the role while it was free (see ``ringGrants()``); role names are at
    /// most 100 bytes, so this stays within a signal name's 128.
    var grantsSignalName: String { "baton.role-grants." + name }
    /// This process's holder lock file, locked while it holds the role.
    let holderLock: RoleLockFile
    /// This process's waiter lock file, locked while one of its tasks waits.
    let waiterLock: RoleLockFile

    /// The cross-process grant this process holds.
    struct Grant: Sendable {
        var epoch: UInt64
        var priority: RolePriority
        var kind: String
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
        /// Who suspended the role: the suspension controllers of the container objects it is
        /// used through (several objects may open one directory), or the role itself
        /// (``Role/suspend()``). The role is suspended while any of them is.
        var suspendedBy: Set<ObjectIdentifier> = []
        var suspended: Bool { !suspendedBy.isEmpty }
        /// Epochs this process held and lost (overtaken, or taken while suspended), with the
        /// epoch that replaced them, for error messages.
        var lost: [UInt64: UInt64] = [:]
        /// Registrations with the suspension controller of every container object the role was
        /// opened through.
        var registrations: [ObjectIdentifier: (controller: SuspensionController, token: SuspensionController.RegistrationToken)] = [:]
        /// Set by a release that answered a stop request: the bell's change word as that release
        /// left it, and until when this process's next acquisition keeps off the arbiter while
        /// the requester's grant has not moved it (``RoleDirectory/successorWait``). Taken by
        /// that acquisition.
        var handedOver: HandOver?
    }

    /// A release that answered a stop request (see ``State/handedOver``).
    struct HandOver: Sendable {
        var changes: UInt32
        var until: Deadline
    }

    let state = Mutex(State())
    /// The state this process last posted with the role's signal (pid in the high half).
    private let lastRing = Mutex<UInt64>(0)
    private let waitSourcesCache = Mutex<WaitSources?>(nil)
    /// Moves when the turn or the grant changes in this process.
    let turnChanges = EventCounter()
    /// How many acquisitions of this process began to wait for the grant of the process it had
    /// just released to (``RoleDirectory/successorWait``; for tests and diagnostics).
    let successorWaits = Atomic<Int>(0)

    private init(container: SharedContainer, name: String) throws {
        self.container = container
        self.name = name
        let directory = try RoleDirectory(container: container, name: name)
        self.directory = directory
        self.holderLock = RoleLockFile(directory: directory, prefix: "holder")
        self.waiterLock = RoleLockFile(directory: directory, prefix: "waiter")
        try holderLock.prepare()
        try waiterLock.prepare()
        directory.sweepDeadFiles()
    }

    deinit {
        for registration in state.withLock({ $0.registrations.values }) {
            registration.controller.unregister(registration.token)
        }
        // The lock files close themselves.
    }

    // MARK: Signal

    /// Rings the role's signal: every change of the record or of a lock file does. The
    /// signal's state tells who rang (this pid and a counter), so a waiter can ignore its own
    /// ring when nobody rang after it.
    func ring() {
        let value = lastRing.withLock { last -> UInt64 in
            last = UInt64(UInt32(bitPattern: baton_process_id())) << 32 | ((last &+ 1) & 0xFFFF_FFFF)
            return last
        }
        try? container.signals.post(signalName, state: value)
    }

    /// Rings the role's grants signal: a grant of the role while it was free, which no
    /// acquisition or holder waits for, only status watchers (who observe both signals).
    func ringGrants() {
        try? container.signals.post(grantsSignalName)
    }

    /// Whether a delivery carries this process's last ring as its state (the caller also
    /// checks that it stands for one post: see ``SignalObserver/takeCounted()``).
    func isOwnRing(_ delivery: SignalDelivery) -> Bool {
        lastRing.withLock { $0 != 0 && $0 == delivery.state }
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
            let core: RoleCore
            if let existing = registry[key]?.core {
                core = existing
            } else {
                core = try RoleCore(container: container, name: name)
                registry[key] = WeakCore(core)
                registry = registry.filter { $0.value.core != nil }
            }
            core.register(with: container.suspension)
            return core
        }
    }

    /// Registers with the suspension controller of a container object the role is opened
    /// through (once per controller): suspending any object of the directory suspends the role.
    private func register(with controller: SuspensionController) {
        let id = ObjectIdentifier(controller)
        guard state.withLock({ $0.registrations[id] == nil }) else { return }
        let token = controller.register(SuspensionForwarder(self, by: id))
        let duplicate = state.withLock { state -> Bool in
            if state.registrations[id] != nil { return true }
            state.registrations[id] = (controller, token)
            if controller.isSuspended { state.suspendedBy.insert(id) }
            return false
        }
        if duplicate { controller.unregister(token) }
    }

    private final class SuspensionForwarder: SuspensionParticipant {
        weak let core: RoleCore?
        let id: ObjectIdentifier
        init(_ core: RoleCore, by id: ObjectIdentifier) {
            self.core = core
            self.id = id
        }
        func suspend() async { core?.suspend(by: id) }
        func resume() async throws { try core?.resume(by: id) }
    }

    /// The identity used by ``Role/suspend()`` and ``RoleLease/suspend()``.
    var ownSuspensionID: ObjectIdentifier { ObjectIdentifier(self) }

    /// Throws `suspended` while any suspension of the role is in force.
    func checkActive(_ doing: @autoclosure () -> String) throws {
        if state.withLock({ $0.suspended }) {
            throw BatonError(.suspended, "cannot \(doing()) while the process is suspended; call resume() first")
        }
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
                    throw BatonError(.busy, "role \(name) is held or being acquired by another task of this process (pid \(baton_process_id())); join its lease with join(priority:kind:deadline:) or wait longer")
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
        let wasCurrent = state.withLock { state -> Bool in
            guard let grant = state.grant, grant.epoch == epoch else { return false }
            state.grant = nil
            state.turnTaken = false
            state.lost[epoch] = current
            return true
        }
        guard wasCurrent else { return }
        container.diagnostics.report(.roleLeaseLost, level: .warning, "lost role \(name) epoch \(epoch) (the current epoch is \(current)): overtaken, or taken while this process was suspended")
        holderLock.unlock()
        turnChanges.notify()
        ring()
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
        guard released != nil else { return }
        handOverTrace("release")
        let suspended = state.withLock { $0.suspended }
        if !suspended {
            // Nothing may be locked while suspended: the record then still names this epoch,
            // but its holder file is unlocked, so others see the role as free.
            let handedOver = try? directory.transition { transaction -> HandOver? in
                guard transaction.record.holder?.epoch == epoch, transaction.record.holder?.pid == baton_process_id() else { return nil }
                let answered = transaction.record.stop != nil
                transaction.record.holder = nil
                transaction.record.stop = nil
                // Read under the lock; this transition's own ring moves the word once more.
                guard answered else { return nil }
                let bound = Duration.nanoseconds(directory.successorWaitNanoseconds.load(ordering: .relaxed))
                return HandOver(changes: directory.bell.changeCount() &+ 1, until: .after(bound))
            }
            if let handedOver { state.withLock { $0.handedOver = handedOver } }
        }
        handOverTrace("release.written")
        holderLock.unlock()
        state.withLock { $0.turnTaken = false }
        turnChanges.notify()
        ring()
    }

    // MARK: Critical sections

    /// Enters a critical section of the grant of `epoch`.
    func enterCritical(_ epoch: UInt64) throws {
        try checkActive("enter a critical section of role \(name)")
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
                guard var holder = transaction.record.holder, holder.epoch == epoch, holder.pid == baton_process_id() else {
                    throw fencedError(epoch, current: transaction.record.holder?.epoch ?? transaction.record.lastEpoch)
                }
                if let stop = transaction.record.stop {
                    throw BatonError(.stopRequested, "role \(name) was asked to stop by priority \(RolePriority(Int(stop.priority))) (pid \(stop.pid)); finish the work in progress and release instead of starting a critical section")
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
        ring()
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
            guard var holder = transaction.record.holder, holder.epoch == epoch, holder.pid == baton_process_id() else { return }
            holder.state = transaction.record.stop == nil ? .running : .stopping
            holder.criticalSinceMonotonic = 0
            transaction.record.holder = holder
            if transaction.record.stop != nil {
                // The grace period restarts when the section ends: the holder may release now.
                transaction.record.stop?.requestedMonotonic = baton_monotonic_ns()
                transaction.record.stop?.requestedWallNanoseconds = RoleDirectory.wallNanoseconds()
            }
        }
        ring()
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
            if let holder = record.holder, holder.epoch == epoch, holder.pid == baton_process_id() { return nil }
            return record.holder?.epoch ?? record.lastEpoch
        }
        if let current {
            markLost(epoch, current: current)
            container.diagnostics.report(.staleEpochRefused, level: .warning, "refused a write fenced by role \(name) epoch \(epoch): the current epoch is \(current)")
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

    func suspend(by id: ObjectIdentifier) {
        state.withLock { _ = $0.suspendedBy.insert(id) }
        // Closing (not only unlocking) also wakes waiters through the close event. Transitions
        // check `suspended` and cannot run meanwhile, so nothing is locked again after this.
        directory.excludingTransitions {
            holderLock.close()
            waiterLock.close()
        }
        turnChanges.notify()
        // Wakes this process's own waiting acquisition (which then fails with `suspended`) and
        // the waiters of other processes (the holder file was closed too).
        ring()
    }

    func resume(by id: ObjectIdentifier) throws {
        let grant = state.withLock { state -> Grant? in
            state.suspendedBy.remove(id)
            return state.suspended ? nil : state.grant
        }
        defer { turnChanges.notify() }
        guard let grant, !holderLock.isLocked else { return }
        let outcome = try directory.transition { transaction -> Result<Void, BatonError> in
            let record = transaction.record
            if let holder = record.holder, holder.epoch == grant.epoch, holder.pid == baton_process_id(), holder.lockID == holderLock.id,
               try holderLock.lock() {
                return .success(())
            }
            let current = record.holder?.epoch ?? record.lastEpoch
            return .failure(BatonError(.lost, "role \(name) was taken while this process was suspended: the current epoch is \(current), this lease had epoch \(grant.epoch); acquire it again"))
        }
        switch outcome {
        case .success:
            if state.withLock({ $0.suspended }) { holderLock.close() }
        case .failure(let error):
            let current = (try? directory.read { $0.holder?.epoch ?? $0.lastEpoch }) ?? 0
            markLost(grant.epoch, current: current)
            throw error
        }
    }

    // MARK: Waiting

    /// What an acquisition sleeps on: the role's signal and the close events of the role's
    /// directory. Created by the first acquisition of the process that has to sleep past the
    /// hand-over watch, then kept for the next ones (used by one at a time: the one holding the
    /// process's turn). A process whose acquisitions only ever asked a holder to stop and
    /// watched the bell never creates them, so the release it waits for (which rings the
    /// role's signal as well) does not wake its signal thread, which then ran first on the
    /// processor the acquiring thread needed. They are kept rather than made for each wait: a
    /// preempted holder that asks again at every hand-over would otherwise register, and pass
    /// once more under the arbiter, each time (idle preemption to connected measured 4-20 µs
    /// slower that way, in 5 of 6 alternated pairs).
    struct WaitSources: Sendable {
        let observation: SignalObservation
        let files: FileEvents.Subscription
    }

    /// The wait sources if an earlier acquisition created them (they have listened since).
    var existingWaitSources: WaitSources? { waitSourcesCache.withLock { $0 } }

    /// The wait sources; the caller reads the record again before it sleeps (a change made
    /// before they listened is in what that pass reads).
    func waitSources() throws -> WaitSources {
        try waitSourcesCache.withLock { cache in
            if let cache { return cache }
            let sources = WaitSources(
                observation: try container.signals.observe(signalName),
                files: try FileEvents.shared.subscribe(path: container.absolutePath(directory.path), interest: .writerGoneInDirectory))
            cache = sources
            return sources
        }
    }
}
