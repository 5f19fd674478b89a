import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization

/// The files of one role under `.baton/roles/<name>/`, and the transitions made on them.
///
/// - `arbiter.lock`: an exclusive `flock` held for microseconds around every transition (shared
///   for reads); never held across an `await`.
/// - `record`: the ``RoleRecord`` (epoch counter, holder, stop request).
/// - `holder-<pid>-<id>.lock`: one per process, locked exclusively while that process holds
///   the role (the record names the file of the current holder); the kernel drops the lock the
///   instant the holder dies or suspends itself. An overtaken holder still locks its own file,
///   which no longer matters: the record names the new holder's file.
/// - `waiter-<pid>-<id>.lock`: one per process, locked while it waits, with its priority, pid
///   and kind inside; the record lists the waiting ones. Files of dead processes are removed by
///   later transitions.
///
/// In a process, one instance exists per role (see ``RoleCore``); its mutex makes the arbiter
/// lock exclusive between the threads of the process too (`flock` alone only excludes other
/// open file descriptions).
final class RoleDirectory: Sendable {
    let container: SharedContainer
    let name: String
    /// `roles/<name>`, relative to `.baton`.
    let path: String

    private struct Descriptors: ~Copyable, @unchecked Sendable {
        // @unchecked: the mapping is only touched while holding the `descriptors` mutex (and,
        // across processes, the arbiter lock).
        /// The record, mapped: writing through the mapping neither allocates nor updates the
        /// file's times on every change, so no transition waits for the file system's journal.
        var record: MappedFile
        /// Whether this process has checked that the `epoch` file holds the reservation (a role
        /// made by an older Baton has none until its reservation first moves).
        var epochFloorChecked = false
        /// Set by a transition that wrote the record; read (and cleared) where the arbiter is
        /// unlocked, which then rings the bell's change word.
        var wroteRecord = false

        /// Whether a transition wrote the record since the last call (clearing it): what the
        /// unlock that follows tells the bell.
        mutating func takeWroteRecord() -> Bool {
            defer { wroteRecord = false }
            return wroteRecord
        }
    }

    // The record's mapping; holding this mutex is the in-process half of the arbiter lock.
    private let descriptors: Mutex<Descriptors>
    /// `arbiter.lock`: its descriptor is the arbiter lock's (taken under `descriptors`), its
    /// first words the lock's release bell.
    let bell: ArbiterBell

    init(container: SharedContainer, name: String) throws {
        try container.makeDirectory("roles")
        let path = "roles/" + name
        try container.makeDirectory(path)
        bell = try ArbiterBell(container, relativePath: path + "/arbiter.lock")
        let record = try MappedFile(container, relativePath: path + "/record", minimumSize: RoleRecord.fileSize)
        self.container = container
        self.name = name
        self.path = path
        self.descriptors = Mutex(Descriptors(record: record))
    }

    // MARK: Arbiter

    /// Runs `body` excluding this process's transitions (not other processes): for suspension,
    /// so that no transition locks a file after the suspension closed it.
    func excludingTransitions<R>(_ body: () -> R) -> R {
        descriptors.withLock { _ in body() }
    }

    /// How long a transition or read without a deadline of its own (a release, a critical
    /// section, a status) waits for the arbiter lock before it fails with `timedOut`. The lock is
    /// held for microseconds; a holder past this bound is stopped or hung.
    static let arbiterWaitBound: Duration = .seconds(2)

    /// A transition: runs `body` holding the arbiter lock exclusively, with the current record.
    /// When `body` changes the record it is written back (synced when `durable` is set by body).
    /// - Parameter deadline: When to stop waiting for the arbiter lock (default:
    ///   ``arbiterWaitBound`` from now). The calling thread sleeps meanwhile.
    /// - Throws: `timedOut` when another process holds the arbiter past the deadline; what
    ///   `body` throws.
    func transition<R>(deadline: Deadline? = nil, _ body: (inout Transaction) throws -> R) throws -> R {
        if let done = try withArbiterSoon(LOCK_EX, { try transact(&$0, body) }) { return done }
        let held = try arbiterWait(LOCK_EX).wait(until: deadline ?? .after(Self.arbiterWaitBound))
        return try withWaitedArbiter(held) { try transact(&$0, body) }
    }

    /// A transition that suspends the task, not its thread, while another process holds the
    /// arbiter lock (for acquisitions, whose deadline may be far).
    /// - Throws: As ``transition(deadline:_:)``; `CancellationError` when the task is cancelled.
    ///
    /// - Returns: `body`'s result, and the bell's change word as this transition leaves it (its
    ///   own write counted): the value a ``watchForChange(after:deadline:until:)`` starts from.
    func transition<R>(waitingUntil deadline: Deadline, _ body: (inout Transaction) throws -> R) async throws -> (result: R, changes: UInt32) {
        let counted = { (descriptors: inout Descriptors) throws -> (result: R, changes: UInt32) in
            let result = try self.transact(&descriptors, body)
            // Read under the lock, this transition's own ring counted: every writing transition
            // after this one moves the word past the value returned. (The ring of one before it
            // that lands only now moves it once more: one extra look for a watch, never a missed
            // release.)
            return (result, self.bell.changeCount() &+ (descriptors.wroteRecord ? 1 : 0))
        }
        if let done = try withArbiterSoon(LOCK_EX, counted) { return done }
        let held = try await arbiterWait(LOCK_EX).value(until: deadline)
        handOverTrace("arbiter.waited")
        return try withWaitedArbiter(held, counted)
    }

    private func transact<R>(_ descriptors: inout Descriptors, _ body: (inout Transaction) throws -> R) throws -> R {
        handOverTrace("pass.locked")
        let (original, condition) = try readRecord(descriptors.record)
        handOverTrace("pass.read")
        let recovered = condition == .recovered
        var transaction = Transaction(record: original, directory: self)
        let result = try body(&transaction)
        handOverTrace("pass.body")
        if transaction.record != original || recovered {
            descriptors.wroteRecord = true
            transaction.record.sequence = original.sequence &+ 1
            transaction.record.bootHash = BootIdentity.hash
            transaction.record.heartbeatWallNanoseconds = Self.wallNanoseconds()
            // A new or recovered record is written to both slots, so that both are intact.
            let slots = condition == .intact ? [Int(transaction.record.sequence % 2)] : [0, 1]
            for slot in slots {
                transaction.record.encode(into: UnsafeMutableRawBufferPointer(
                    start: descriptors.record.pointer.advanced(by: slot * RoleRecord.slotSize), count: RoleRecord.slotSize))
            }
            handOverTrace("pass.encoded")
            if transaction.durable || recovered {
                try descriptors.record.sync()
            }
            if transaction.durable {
                // The second, independent copy of the reservation, before the epoch is used.
                try writeEpochFloor(transaction.record.reservedEpoch)
                descriptors.epochFloorChecked = true
            }
        }
        if !descriptors.epochFloorChecked {
            if (try readEpochFloor().value ?? 0) < transaction.record.reservedEpoch {
                try writeEpochFloor(transaction.record.reservedEpoch)
            }
            descriptors.epochFloorChecked = true
        }
        return result
    }

    /// Reads the record holding the arbiter lock shared (a consistent snapshot).
    /// - Throws: `timedOut` when another process holds the arbiter past ``arbiterWaitBound``.
    func read<R>(_ body: (RoleRecord) throws -> R) throws -> R {
        let read = { (descriptors: inout Descriptors) in try body(try self.readRecord(descriptors.record).record) }
        if let done = try withArbiterSoon(LOCK_SH, read) { return done }
        return try withWaitedArbiter(try arbiterWait(LOCK_SH).wait(until: .after(Self.arbiterWaitBound)), read)
    }

    // The arbiter is normally free or held for microseconds: one non-blocking `flock` under the
    // mutex. When another process holds it, the wait (see ``ArbiterWait``) happens outside the
    // mutex, so the other threads of this process keep their own deadlines; the lock is then
    // held through the wait's own descriptor, which excludes this process's descriptor too.

    /// How long a transition watches an arbiter lock that another process holds before it waits
    /// for it on a thread of its own (``ArbiterWait``).
    ///
    /// A transition holds the lock for 5-25 µs, and two processes meet there at every
    /// hand-over: the preempted holder asks again for the role (queueing as a waiter) just as
    /// the process it released to takes it. The watch (``ArbiterBell``) takes the lock as soon
    /// as the other's transition lets go; the wait on a thread costs an `open`, a thread's start
    /// and a hand-back to the caller's executor, about as long as this bound, which is why it is
    /// the bound: a holder that is slower than that (stopped, preempted) is waited for as
    /// before, having cost at most twice what waiting at once would have. The calling thread is
    /// busy for ``arbiterSpin`` at most and asleep in the kernel for the rest.
    static let arbiterWatch: Duration = .microseconds(100)

    /// How long a watch stays on the processor, watching the bell's word without a system call,
    /// before it sleeps on the word: long enough for a transition running on another processor
    /// to end, short enough that a holder waiting for this very processor is not kept from it
    /// for long.
    ///
    /// The watch never yields the processor (`sched_yield`), which it did before the bell: a
    /// yield hands it to any runnable thread, and a CPU-bound one keeps it for its whole time
    /// slice. On Linux 6.18 (EEVDF moves a yielding task's virtual runtime past its deadline),
    /// 12 of the 29 watches in a loaded `baton bench lifecycle` lasted 1.1-4.8 ms against the
    /// 100 µs bound, one hand-over in 30. Spinning without the yield kept every watch within
    /// 101-110 µs under load, but idle, where the yield had let a holder that shared the
    /// processor finish, 3-24 watches per run ran out and waited on a thread (idle p99 of
    /// preemption to connected 463-694 µs against 286-429 µs with the yield, three alternated
    /// runs each); sleeping on the bell lets that holder run without handing the processor to
    /// anyone else for longer than the holder needs. With the bell, in two loaded and two idle
    /// traced runs, 2 of 392 watches lasted over 200 µs (329 µs, and 2.2 ms loaded: a watcher
    /// that, woken, waited for a processor), and none waited on a thread.
    static let arbiterSpin: Duration = .microseconds(20)

    /// This directory's bound on watching a held arbiter (``arbiterWatch``; tests lengthen it).
    let arbiterWatchNanoseconds = Atomic<Int64>(arbiterWatch.nanoseconds)
    /// How many transitions and reads of this process found the arbiter held and watched it
    /// (for tests).
    let arbiterWatches = Atomic<Int>(0)
    /// How many of them then waited for it on a thread of their own (for tests).
    let arbiterWaits = Atomic<Int>(0)

    // MARK: Hand-over watch

    /// How long an acquisition that has just asked a live holder to stop waits for the
    /// holder's release on its own thread, asleep in the kernel on the bell's change word
    /// (``ArbiterBell``), before it waits as every other acquisition does, suspended until the
    /// role's signal rings.
    ///
    /// The release then wakes the acquiring thread itself, as the holder's `flock(LOCK_UN)` wakes
    /// a process blocked in `flock`. The suspended wait costs one more wake-up on the way: this
    /// process's signal thread is woken, and resumes the acquisition on a thread of the task's
    /// executor, which it must wake too (on Swift's global executor, a pool thread). Measured
    /// with the hand-over trace points, that step took 20-40 µs of a hand-over on the two-core
    /// machine, loaded or not, and longer when the threads had slept for a while.
    ///
    /// The bound covers a holder that closes a connection and releases: 80-150 µs in the
    /// lifecycle benchmark's hand-overs. A holder that takes longer (a critical section, a
    /// graceful close) is waited for as before, having held the acquiring thread for this long
    /// at most, once per acquisition. The thread sleeps in the kernel meanwhile; the task's
    /// cancellation and deadline are looked at when the watch ends (the deadline also bounds
    /// the watch). An acquisition on the main actor holds the main thread that long at most,
    /// 1.5% of a 60 Hz frame, as the arbiter's watch (``arbiterWatch``) may already.
    static let handOverWatch: Duration = .microseconds(250)

    /// How long, at most, the next acquisition of a process that has just released the role on
    /// a stop request waits before its first pass, so that the requester's grant pass finds
    /// the arbiter lock free.
    ///
    /// A preempted holder that asks again at once (a ``ConnectionSupervisor`` does) queues as a
    /// waiter in its first pass, which takes the arbiter lock just when the requester's grant
    /// pass needs it. In traced runs of `baton bench lifecycle`, the requester then watched
    /// the arbiter in 8-16% of hand-overs, 40-45 µs more each. The asker cannot get the role
    /// before the requester (whose priority is higher) unless the requester gives up, dies, or
    /// releases: the first rings the role's signal, the second closes its lock files, the third
    /// rings the signal too, and each ends the wait at once. The grant itself wakes nobody, by
    /// design: a wake-up there would cost the requester what the wait saves it (the grant of a
    /// role left free rings only the grants signal, see ``RoleCore/ringGrants()``). So the
    /// wait lasts this long unless one of those comes first, or a wake-up finds the grant
    /// written; the asker is meanwhile not yet listed as a waiter (a process of a priority
    /// between the two that asks then is not told to wait behind it).
    static let successorWait: Duration = .milliseconds(2)

    /// This directory's bound on a wait for the successor's grant (``successorWait``; tests
    /// lengthen it).
    let successorWaitNanoseconds = Atomic<Int64>(successorWait.nanoseconds)

    /// This directory's bound on a hand-over watch (``handOverWatch``; tests lengthen it).
    let handOverWatchNanoseconds = Atomic<Int64>(handOverWatch.nanoseconds)
    /// How many hand-over watches this process began (for tests).
    let handOverWatches = Atomic<Int>(0)
    /// How many of them a change of the record ended before their bound (for tests).
    let handOverWatchWakes = Atomic<Int>(0)

    /// Sleeps until a transition of any process writes the record after the one that left the
    /// bell's change word at `seen`, or until ``handOverWatchNanoseconds`` pass (or `deadline`,
    /// or `until`, monotonic nanoseconds, when sooner). Blocks the calling thread.
    /// - Returns: Whether the record changed (look again now); false when the watch timed out.
    func watchForChange(after seen: UInt32, deadline: Deadline, until: UInt64?) -> Bool {
        // Counted once the bell counts it: a watch counted in `handOverWatches` is either still
        // counted by the bell or over (what the tests look for).
        bell.beginChangeWatch()
        defer { bell.endChangeWatch() }
        handOverWatches.add(1, ordering: .relaxed)
        let now = baton_monotonic_ns()
        var end = now &+ UInt64(max(0, handOverWatchNanoseconds.load(ordering: .relaxed)))
        if let remaining = deadline.remaining {
            end = min(end, now &+ UInt64(max(0, remaining.nanoseconds)))
        }
        if let until { end = min(end, until) }
        handOverTrace("handover.watch")
        guard bell.waitForChange(after: seen, until: end) else { return false }
        handOverTrace("handover.woke")
        handOverWatchWakes.add(1, ordering: .relaxed)
        return true
    }

    /// Runs `body` under the mutex once the arbiter lock is free, watching its bell
    /// (``ArbiterBell``) for ``arbiterWatchNanoseconds`` at most; `nil` when another process
    /// still holds it then (the caller waits with ``arbiterWait(_:)``).
    private func withArbiterSoon<R>(_ operation: Int32, _ body: (inout Descriptors) throws -> R) throws -> R? {
        if let done = try withFreeArbiter(operation, body) { return done }
        arbiterWatches.add(1, ordering: .relaxed)
        handOverTrace("arbiter.watch")
        defer { handOverTrace("arbiter.watched") }
        let start = baton_monotonic_ns()
        let end = start &+ UInt64(max(0, arbiterWatchNanoseconds.load(ordering: .relaxed)))
        let spinEnd = min(end, start &+ UInt64(Self.arbiterSpin.nanoseconds))
        bell.beginWatch()
        defer { bell.endWatch() }
        while true {
            // Read before the try: a release after it moves the word, and rings this watcher awake.
            let seen = bell.releaseCount()
            if let done = try withFreeArbiter(operation, body) { return done }
            guard baton_monotonic_ns() < end else { break }
            bell.wait(after: seen, spinningUntil: spinEnd, until: end)
        }
        arbiterWaits.add(1, ordering: .relaxed)
        return nil
    }

    /// Runs `body` under the mutex if the arbiter lock is free now; `nil` when another process
    /// holds it.
    private func withFreeArbiter<R>(_ operation: Int32, _ body: (inout Descriptors) throws -> R) throws -> R? {
        try descriptors.withLock { descriptors -> R? in
            guard try Sys.tryFlock(bell.fd, operation).get("locking the arbiter of role \(name)") else { return nil }
            defer {
                let changed = descriptors.takeWroteRecord()
                _ = Sys.flock(bell.fd, LOCK_UN)
                bell.ring(changed: changed)
            }
            return try body(&descriptors)
        }
    }

    /// Starts waiting for the arbiter lock on a descriptor of its own.
    private func arbiterWait(_ operation: Int32) throws -> ArbiterWait {
        ArbiterWait(try container.openDescriptor(path + "/arbiter.lock", flags: O_RDONLY), operation: operation, bell: bell)
    }

    /// Runs `body` under the mutex with the arbiter lock held through `held` (from
    /// ``ArbiterWait``), then unlocks and closes it; `nil` (the deadline passed) throws `timedOut`.
    private func withWaitedArbiter<R>(_ held: consuming FileDescriptor?, _ body: (inout Descriptors) throws -> R) throws -> R {
        guard let held = held.take() else {
            throw BatonError(.timedOut, "another process has held the arbiter lock of role \(name) past the deadline (a transition takes microseconds: that process is stopped or hung); retry later, or see which process holds \(container.absolutePath(path))/arbiter.lock with `baton inspect`")
        }
        var changed = false
        let result = Result {
            try descriptors.withLock { descriptors in
                defer { changed = descriptors.takeWroteRecord() }
                return try body(&descriptors)
            }
        }
        held.unlockAndClose()
        bell.ring(changed: changed)
        return try result.get()
    }

    /// What ``readRecord(_:)`` found.
    private enum RecordCondition {
        /// Both slots valid.
        case intact
        /// A new role: nothing written yet.
        case new
        /// Rebuilt from what was left: written back to both slots at once.
        case recovered
    }

    /// The record, and whether it is intact, new, or had to be recovered.
    ///
    /// The epoch counter never goes back, whatever happened to the record: while both slots are
    /// intact the newest one is used. Otherwise (a slot torn, zeroed or forged, the file
    /// truncated or removed) the counter restarts from the highest durable reservation known:
    /// the intact slot's and the one kept in the separate `epoch` file (see
    /// ``writeEpochFloor(_:)``); every epoch granted so far is at or below it. With no copy left
    /// at all, see ``recoverLostEpochs()``.
    private func readRecord(_ record: MappedFile) throws -> (record: RoleRecord, condition: RecordCondition) {
        // A record file cut short by someone else would fault the mapping (SIGBUS): extend it
        // again first (the lost part reads as zeros, and a record without a valid slot is
        // recovered below).
        let size = Int(try Sys.fstat(record.fd).get("checking the record of role \(name)").st_size)
        if size < RoleRecord.fileSize {
            try FileSpace.reserve(record.fd, from: size, to: RoleRecord.fileSize, path: "the record of role \(name)")
        }
        let count = min(record.size, RoleRecord.fileSize)
        // Under the arbiter lock nobody writes the mapping, so it is decoded in place.
        let reading = RoleRecord.read(in: UnsafeRawBufferPointer(start: record.pointer, count: count))
        if let newest = reading.newest, reading.intactSlots == 2 { return (newest, .intact) }
        let floor = try readEpochFloor()
        switch (reading.newest, floor) {
        case (nil, .missing) where reading.isEmpty:
            return (RoleRecord(), .new)
        case (nil, .missing), (nil, .damaged):
            return (recoverLostEpochs(), .recovered)
        default:
            var recovered = reading.newest ?? RoleRecord()
            let highest = max(recovered.reservedEpoch, floor.value ?? 0)
            recovered.lastEpoch = max(recovered.lastEpoch, highest)
            recovered.reservedEpoch = highest
            return (recovered, .recovered)
        }
    }

    /// Every copy of the epoch counter is lost (both slots and the `epoch` file damaged, or the
    /// record damaged and the file removed): the holder is unknown and the counter must still
    /// never go back. It restarts at the wall clock in microseconds, above every epoch granted
    /// before: epochs count up by one per grant from 1 (or from an earlier such restart), and a
    /// grant takes far longer than a microsecond. The jump is visible in the epoch itself (about
    /// 1.7e15 in 2024). This assumes the wall clock was not set back past the previous restart;
    /// a process that still believes in an older epoch is fenced by the next grant.
    private func recoverLostEpochs() -> RoleRecord {
        let floor = UInt64(max(Self.wallNanoseconds() / 1000, 0))
        var record = RoleRecord()
        record.lastEpoch = floor
        record.reservedEpoch = floor
        return record
    }

    // MARK: Epoch floor

    /// The `epoch` file: the durable epoch reservation, a second copy independent of the record
    /// (two checksummed copies, replaced atomically when the reservation moves, once per
    /// ``RoleRecord/reservationBlock`` grants).
    private var epochFloorPath: String { path + "/epoch" }

    private enum EpochFloor {
        case missing
        case damaged
        case valid(UInt64)
        var value: UInt64? { if case .valid(let value) = self { return value } else { return nil } }
    }

    private static let epochFloorMagic: UInt32 = 0x424C_4531 // "BLE1"
    private static let epochFloorCopySize = 32

    private func writeEpochFloor(_ epoch: UInt64) throws {
        var bytes = [UInt8](repeating: 0, count: 2 * Self.epochFloorCopySize)
        bytes.withUnsafeMutableBytes { raw in
            for copy in 0..<2 {
                let base = copy * Self.epochFloorCopySize
                raw.storeBytes(of: Self.epochFloorMagic.littleEndian, toByteOffset: base, as: UInt32.self)
                raw.storeBytes(of: epoch.littleEndian, toByteOffset: base + 8, as: UInt64.self)
                let crc = Checksum.crc32c(UnsafeRawBufferPointer(rebasing: raw[base..<(base + 16)]))
                raw.storeBytes(of: crc.littleEndian, toByteOffset: base + 16, as: UInt32.self)
            }
        }
        try container.replaceFile(epochFloorPath, with: bytes)
    }

    private func readEpochFloor() throws -> EpochFloor {
        guard let file = try container.openDescriptorIfPresent(epochFloorPath, flags: O_RDONLY) else { return .missing }
        var bytes = [UInt8](repeating: 0, count: 2 * Self.epochFloorCopySize)
        let count = try bytes.withUnsafeMutableBytes { try Sys.preadAll(file.rawValue, $0, at: 0).get("reading \(epochFloorPath)") }
        let values = bytes.withUnsafeBytes { raw in
            (0..<2).compactMap { copy -> UInt64? in
                let base = copy * Self.epochFloorCopySize
                guard count >= base + Self.epochFloorCopySize,
                      UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: base, as: UInt32.self)) == Self.epochFloorMagic,
                      UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: base + 16, as: UInt32.self))
                        == Checksum.crc32c(UnsafeRawBufferPointer(rebasing: raw[base..<(base + 16)])) else { return nil }
                return UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: base + 8, as: UInt64.self))
            }
        }
        return values.max().map { .valid($0) } ?? .damaged
    }

    // MARK: Files

    /// The lock file of a holder.
    func holderFile(_ holder: RoleRecord.HolderEntry) -> String {
        RoleLockFile.relativePath(directory: self, prefix: "holder", pid: holder.pid, id: holder.lockID)
    }

    /// Whether the holder still holds its lock file (it is alive and not suspended). Opens
    /// read-only, so the check itself wakes nobody.
    func isHolderAlive(_ holder: RoleRecord.HolderEntry) throws -> Bool {
        if holder.pid == baton_process_id() { return try isLocked(holderFile(holder)) }
        return try holderCheck.withLock { cache in
            if cache.lockID != holder.lockID || cache.pid != holder.pid || cache.fd == nil {
                cache = HolderCheck() // closes the previous holder's file
                switch Sys.openat(container.directory, holderFile(holder), O_RDONLY) {
                case .success(let fd): cache = HolderCheck(pid: holder.pid, lockID: holder.lockID, file: FileDescriptor(adopting: fd))
                case .failure(let error) where error.errno == ENOENT: return false
                case .failure(let error): throw BatonError.system(error, "opening \(holderFile(holder))")
                }
            }
            guard let fd = cache.fd else { return false }
            guard try Sys.tryFlock(fd, LOCK_SH).get("checking \(holderFile(holder))") else { return true }
            _ = Sys.flock(fd, LOCK_UN)
            return false
        }
    }

    /// The holder file last checked, kept open: while the same process holds the role, each
    /// check is one `flock`. A file is named by its owner's pid and a random id, and it is only
    /// deleted once that pid is gone, so the open descriptor always is the file the record names.
    private struct HolderCheck: ~Copyable {
        var pid: Int32 = 0
        var lockID: UInt64 = 0
        /// Open while a holder's file is cached; closed when replaced or when the role goes.
        var file: FileDescriptor?
        /// `file`'s number, borrowed for a system call.
        var fd: Int32? {
            switch file {
            case .some(let file): file.rawValue
            case .none: nil
            }
        }
    }
    private let holderCheck = Mutex(HolderCheck())

    private func isLocked(_ relativePath: String) throws -> Bool {
        let file: FileDescriptor
        switch Sys.openat(container.directory, relativePath, O_RDONLY) {
        case .success(let value): file = FileDescriptor(adopting: value)
        case .failure(let error) where error.errno == ENOENT: return false
        case .failure(let error): throw BatonError.system(error, "opening \(relativePath)")
        }
        return !(try Sys.tryFlock(file.rawValue, LOCK_SH).get("checking \(relativePath)"))
    }

    func removeFile(_ relativePath: String) {
        _ = Sys.unlinkat(container.directory, relativePath)
    }

    /// Whether process `pid` is certainly gone, so that its lock files may be removed (cleanup
    /// only: who holds a role is decided by the files' locks, never by a pid).
    static func isDead(_ pid: Int32) -> Bool {
        pid != baton_process_id() && ProcessExistence.isCertainlyGone(pid)
    }

    /// Removes the lock file of a previous holder whose process is gone.
    func removeIfDead(_ holder: RoleRecord.HolderEntry) {
        if Self.isDead(holder.pid) { removeFile(holderFile(holder)) }
    }

    /// Writes the text of a waiter file into `content` (``RoleLockFile/contentSize`` bytes, the
    /// file's mapping): its priority, this process's pid, the wall time and `kind`, separated by
    /// spaces, then newlines to the end (at least one; `kind` is cut to fit). Written in place,
    /// with no `String` and no array: every pass that queues a process writes it, and formatting
    /// it into a `String` and copying that through two arrays was the largest step of such a
    /// pass (4.1-4.2 µs with the `flock`, in BENCHMARKS.md's breakdown of the first pass).
    static func writeWaiterContent(priority: RolePriority, kind: String, into content: UnsafeMutableRawBufferPointer) {
        var at = 0
        func put(_ byte: UInt8) {
            guard at < content.count - 1 else { return }
            content[at] = byte
            at += 1
        }
        func put(_ value: Int64) {
            if value < 0 { put(UInt8(ascii: "-")) }
            var magnitude = value.magnitude
            let first = at
            repeat {
                put(UInt8(ascii: "0") + UInt8(magnitude % 10))
                magnitude /= 10
            } while magnitude > 0
            // The digits went in least significant first.
            var (low, high) = (first, at - 1)
            while low < high {
                content.swapAt(low, high)
                low += 1
                high -= 1
            }
        }
        put(Int64(priority.value))
        put(UInt8(ascii: " "))
        put(Int64(baton_process_id()))
        put(UInt8(ascii: " "))
        put(wallNanoseconds())
        put(UInt8(ascii: " "))
        for byte in kind.utf8 { put(byte) }
        while at < content.count {
            content[at] = UInt8(ascii: "\n")
            at += 1
        }
    }

    /// A live waiter read from its file.
    struct WaiterEntry: Sendable, Hashable {
        var id: UInt64
        var priority: RolePriority
        var pid: Int32
        var sinceWallNanoseconds: Int64
        var kind: String
    }

    /// The waiters of `record` whose files are locked now, highest priority first (oldest first
    /// within a priority), excluding `excluding`. With `removeDead` (only inside a transition),
    /// entries whose file is not locked are dropped from `record` and the files of dead processes
    /// are deleted. With `kinds`, each waiter's kind is read from its file (for the status).
    ///
    /// The record lists the waiters, so this costs an `open` and a `flock` per waiting process of
    /// another process and nothing when nobody else waits: no directory listing.
    func liveWaiters(in record: inout RoleRecord, excluding: UInt64 = 0, removeDead: Bool, kinds: Bool = false) throws -> [WaiterEntry] {
        var result: [WaiterEntry] = []
        var stale: Set<UInt64> = []
        for waiter in record.waiters where waiter.id != excluding {
            let relative = RoleLockFile.relativePath(directory: self, prefix: "waiter", pid: waiter.pid, id: waiter.id)
            let file: FileDescriptor
            switch Sys.openat(container.directory, relative, O_RDONLY) {
            case .success(let value): file = FileDescriptor(adopting: value)
            case .failure(let error) where error.errno == ENOENT:
                stale.insert(waiter.id)
                continue
            case .failure(let error): throw BatonError.system(error, "opening \(relative)")
            }
            let fd = file.rawValue // closed with `file`, at the end of this iteration
            if try Sys.tryFlock(fd, LOCK_SH).get("checking \(relative)") {
                stale.insert(waiter.id)
                if removeDead, Self.isDead(waiter.pid) { removeFile(relative) }
                continue
            }
            var kind = ""
            if kinds {
                var buffer = [UInt8](repeating: 0, count: RoleLockFile.contentSize)
                let count = try buffer.withUnsafeMutableBytes { try Sys.preadAll(fd, $0, at: 0).get("reading \(relative)") }
                let text = String(decoding: buffer[0..<count], as: UTF8.self).prefix { $0 != "\n" }
                let fields = text.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false)
                if fields.count == 4 { kind = String(fields[3]) }
            }
            result.append(WaiterEntry(
                id: waiter.id, priority: RolePriority(Int(waiter.priority)), pid: waiter.pid,
                sinceWallNanoseconds: waiter.sinceWallNanoseconds, kind: kind))
        }
        if removeDead, !stale.isEmpty { record.waiters.removeAll { stale.contains($0.id) } }
        if result.count > 1 {
            result.sort { ($0.priority, -$0.sinceWallNanoseconds) > ($1.priority, -$1.sinceWallNanoseconds) }
        }
        return result
    }

    /// Deletes the lock files of processes that are gone (a process that crashed while it neither
    /// held nor waited leaves its files behind): called when a process opens the role.
    func sweepDeadFiles() {
        guard let directory = try? container.openDescriptor(path, flags: O_RDONLY | O_DIRECTORY) else { return }
        guard let stream = fdopendir(directory.rawValue) else { return }
        _ = directory.release() // the stream owns it now: closedir closes it
        defer { closedir(stream) }
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            guard let (pid, _) = RoleLockFile.parse(name, prefix: "waiter") ?? RoleLockFile.parse(name, prefix: "holder"),
                  Self.isDead(pid), (try? isLocked(path + "/" + name)) == false else { continue }
            removeFile(path + "/" + name)
        }
    }

    static func wallNanoseconds() -> Int64 {
        Int64((Date().timeIntervalSince1970 * 1e9).rounded())
    }

    /// A record being changed inside ``transition(_:)``.
    struct Transaction {
        var record: RoleRecord
        /// Set to sync the record to disk after writing it (epoch reservations).
        var durable = false
        let directory: RoleDirectory

        /// The next epoch, never reused: reserves a durable block when needed.
        mutating func nextEpoch() -> UInt64 {
            if record.bootHash != BootIdentity.hash {
                // A reboot since the last write: unsynced epochs may be lost; jump past the
                // durable reservation.
                record.lastEpoch = max(record.lastEpoch, record.reservedEpoch)
            }
            record.lastEpoch &+= 1
            if record.lastEpoch > record.reservedEpoch {
                record.reservedEpoch = record.lastEpoch &+ RoleRecord.reservationBlock
                durable = true
            }
            return record.lastEpoch
        }
    }
}
