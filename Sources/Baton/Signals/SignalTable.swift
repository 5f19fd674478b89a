import CBatonShims
import Synchronization

/// The signal backend, on every platform: a table of named counters and states in a file mapped
/// by every process of the container, woken through ``AddressWait`` (futex on Linux,
/// `os_sync_wait_on_address` on Apple platforms).
///
/// Layout of `.baton/signals` (little-endian, fixed size):
/// ```
/// header (4096 bytes)
///   0  magic "BATNSIG1"     8  version      12 slot count   16 slot size
///   20 CRC-32C of bytes 0..<20              24 retired (1 once replaced by a rebuilt table)
///   64 sequence  (the wait word of the processes that found no entry below)
///   128 waiters  (processes whose signal thread may be asleep on `sequence`)
///   1024 process entries (64 x 32 bytes), one per observing process:
///        0 pid (for diagnostics)   4 doorbell (wait word)   8 sleeping (while its thread may
///        sleep: 1 on the doorbell, 2 + b on group word b)   16 interest (bit `slot % 64` set
///        for each slot the process observes)   24 owner token (``OwnerTokens``; 0 when free)
///   3072 group words (64 x 16 bytes): word b is where the processes whose interest is bit b
///        alone sleep
/// slots (256 bytes each), open addressing by name hash, never removed
///   0 status (0 empty, 1 ready)   4 name length   8 name hash (FNV-1a 64)
///   16 counter   24 state   32 observers (processes observing this name)
///   36 CRC-32C of name length, hash and name   40 name (128 bytes)
/// ```
/// `.baton/signals.lock` is the table lock (an `flock`, held for microseconds to create a name
/// or rebuild the table); its first 4 bytes are the release word that a holder bumps and rings
/// after it unlocks, so that a waiter sleeps in the kernel and says `busy` after
/// ``tableLockPatience`` instead of waiting for ever on a stopped holder.
///
/// A post wakes only the processes that observe a name in the same interest bit, and never the
/// posting process's thread: the poster delivers to its own observers itself. A process whose
/// names all fall in one bit sleeps on that bit's group word, shared with every other such
/// process, so that one wake call reaches all of them (a post to sixteen watchers of one name is
/// one system call, not sixteen in a row, each of which would hand the poster's processor to
/// the process it woke before the next); a process watching names in several bits, or one that
/// has itself posted in its bit (whose posts would ring the group word it sleeps on), sleeps on
/// its own doorbell, which the poster rings when any of them is posted. A process owns its entry
/// through its owner token, which the kernel releases when the process dies or suspends, so a
/// crashed process's entry is reused and no pid check is needed.
/// When the 64 entries are taken, a process sleeps on the shared `sequence` word instead.
///
/// The table is not durable (it is not synced; a rebooted device may find it empty), but it is
/// not thrown away either: when it fails its checks it is rebuilt (a new file renamed over the
/// old one; the old one is marked retired so every process moves to the new one), and every slot
/// that passes its checks is carried over with its counter and state. Every observer gets one
/// delivery, because posts may have been missed.
final class SignalTable: SignalBackend, KernelWaitSource, @unchecked Sendable {
    // @unchecked: all mutable state is in `state` (a Mutex), except `sleepingFlag`,
    // `roundDeliveries` and `spareJobs`, which only the signal thread touches (in its rounds:
    // `prepareToSleep`, `runJobs`, `roundEnded`; so they skip Swift's dynamic exclusivity
    // check, `@exclusivity(unchecked)`); the mapped memory is shared with other processes and
    // only touched through atomics (CBatonShims) or under `signals.lock`.

    static let magic: UInt64 = 0x3147_4953_4E54_4142 // "BATNSIG1" little-endian
    /// 4: processes with one interest bit sleep on the bit's group word (3: on their doorbell
    /// only; a version-3 poster would not ring a group word); 3: entries are owned through owner
    /// tokens (2 used OFD locks).
    static let version: UInt32 = 4
    static let headerSize = 4096
    static let slotSize = 256
    static let slotCount = 4096
    static let fileSize = headerSize + slotSize * slotCount
    static let entryOffset = 1024
    static let entrySize = 32
    static let entryCount = 64
    static let groupOffset = 3072
    static let groupStride = 16
    /// The entry's "sleeping" word: where its thread may sleep now (0: awake, or not in the
    /// entry), read by posters to know whom to wake and on which word.
    static let sleepsOnDoorbell: UInt32 = 1
    static let sleepsOnGroup: UInt32 = 2

    /// Whether `map` is big enough to hold the process entries and the group words.
    private static func hasEntries(_ map: MappedFile) -> Bool { map.size >= groupOffset + entryCount * groupStride }
    static let fileName = "signals"
    static let lockName = "signals.lock"

    /// The container's directory and owner tokens, not the container: the container keeps its
    /// ``Signals`` (and so this table) for its whole life, so a reference back to it would keep
    /// it, this table, the thread and the mapping alive forever.
    private let files: ContainerFiles
    private let owners: OwnerTokens

    /// An observer's place in ``State/observers``. A class, so that the signal thread reads and
    /// advances an entry in place: a struct holding the weak reference was copied (weak
    /// reference and all) whenever the dictionary handed it out, at every delivery.
    private final class Observed {
        weak var observer: SignalObserver?
        var slot: Int
        var lastSeen: UInt64

        init(observer: SignalObserver, slot: Int, lastSeen: UInt64) {
            self.observer = observer
            self.slot = slot
            self.lastSeen = lastSeen
        }

        /// When the slot's counter moved to `counter`: records it as seen, and returns the
        /// observer with how far the counter moved (`observer` is `nil` once it is gone).
        func advance(to counter: UInt64) -> (observer: SignalObserver?, posts: UInt64)? {
            guard counter != lastSeen else { return nil }
            guard let observer else { return (nil, 0) }
            defer { lastSeen = counter }
            return (observer, counter &- lastSeen)
        }
    }

    /// A delivery collected under the lock, made after it.
    private struct Delivery {
        let observer: SignalObserver
        let state: UInt64
        let posts: UInt64
    }

    private struct State {
        var map: MappedFile
        var slotCache: [String: Int] = [:]
        var observers: [UInt64: Observed] = [:]
        var nextID: UInt64 = 0
        var countedAsWaiter = false
        /// This process's entry in the table, once it observes anything, and the token it was
        /// claimed with.
        var entry: Int?
        var entryToken: UInt64 = 0
        /// Observers of this process per interest bit.
        var bitCounts = [Int](repeating: 0, count: SignalTable.entryCount)
        /// The interest bits this process has posted in. Its thread never sleeps on their group
        /// words, which its own posts ring: a process that posts a name it also observes (every
        /// process of a role does) would wake its own thread with each of its posts, for nothing,
        /// and on a busy machine that thread takes the poster's processor.
        var postedBits: UInt64 = 0
        /// While the container is suspended, the owner token is released (a suspended process
        /// holds no lock) and no entry is claimed.
        var suspended = false
        /// Observers referenced while the lock was held (by ``moveToTable(_:_:)``), released
        /// only after it is (``withState(_:)``): an observer whose last reference dies runs its
        /// `deinit`, which unregisters under the same lock.
        var releasing: [SignalObserver] = []
        /// The interest mask this process's observers call for.
        var interest: UInt64 {
            var mask: UInt64 = 0
            for (bit, count) in bitCounts.enumerated() where count > 0 { mask |= UInt64(1) << UInt64(bit) }
            return mask
        }
    }

    private let state: Mutex<State>
    /// The signal thread: sleeps on this process's entry doorbell (or the table's sequence word)
    /// while anything is observed, on its private word otherwise. An observer's registration and
    /// a job queued for its executor wake it (``KernelWaitThread/wake(start:)``), which rings the
    /// word it sleeps on: one wait covers both.
    private let thread = KernelWaitThread(name: "baton-signals")
    /// The entry's "may sleep" word and its mapping, from the last look before a sleep until the
    /// round ends (signal thread only).
    @exclusivity(unchecked) private var sleepingFlag: (map: MappedFile, word: UnsafeMutablePointer<UInt32>)?
    /// The storage of a round's deliveries, kept empty between rounds so that a round that
    /// delivers does not allocate an array (signal thread only).
    @exclusivity(unchecked) private var roundDeliveries: [Delivery] = []
    /// The storage of the last batch of jobs, kept empty for the queue to swap with (signal
    /// thread only, in ``runJobs(on:)``).
    @exclusivity(unchecked) private var spareJobs: [UnownedJob] = []

    init(container: SharedContainer) throws {
        files = container.files
        owners = container.owners
        state = Mutex(State(map: try Self.openValidTable(container.files)))
        threadExecutor = SignalThreadExecutor(thread: thread)
        jobExecutor = threadExecutor.asUnownedTaskExecutor()
        thread.attach(self)
    }

    /// The table is gone (the container, its ``Signals`` and every observation are): frees this
    /// process's entry for other processes (even if this container's owner token lives on in
    /// another of its parts), and stops the signal thread, which holds the table only while it
    /// goes round, never while it sleeps. Jobs queued for the thread and not run yet go to the
    /// global executor.
    deinit {
        state.withLock { state in
            // A truncated table is left alone (its pages would fault); it is rebuilt on next use.
            guard !Self.isTruncated(state.map) else { return }
            // (Observers whose own deinit did not unregister them yet: none is alive, or it
            // would hold this table.)
            for observed in state.observers.values { baton_sub32(slotWord(state.map, observed.slot, 32), 1) }
            if state.countedAsWaiter { baton_sub32(Self.word(state.map, 128), 1) }
            if let entry = state.entry {
                baton_store64(entryInterest(state.map, entry), 0)
                baton_store32(entryWord(state.map, entry, 8), 0)
                _ = baton_cas64(entryToken(state.map, entry), state.entryToken, 0)
            }
        }
        thread.shutdown()
        for job in threadExecutor.close() { globalConcurrentExecutor.enqueue(job) }
    }

    /// Runs `body` under the state's lock, then drops the observers it kept alive outside it.
    private func withState<R>(_ body: (inout State) throws -> R) rethrows -> R {
        var released: [SignalObserver] = []
        defer { withExtendedLifetime(released) {} }
        return try state.withLock { state in
            defer { swap(&released, &state.releasing) }
            let result = try body(&state)
            // A touch in `body` that faulted past the end of a file cut short under it (the
            // mapping guard put zeros back, so only this process knows): rebuilt now, before
            // the lock is let go, so that no process goes on with a table of zeros.
            if state.map.hasUncheckedRepair { _ = try? followRetirement(&state) }
            return result
        }
    }

    // MARK: Opening, validating, rebuilding

    /// How long a process waits for the table lock before it says `busy`. A running holder
    /// keeps it for microseconds (a rebuild, a new name); a wait this long means the holder is
    /// stopped (SIGSTOP, a debugger) inside one, and is not waited for for ever.
    static let tableLockPatience: Duration = .seconds(2)

    /// Runs `body` holding the table lock (`signals.lock`, an `flock`, its release word at
    /// offset 0 of the same file: ``RingingFlock``). Past ``tableLockPatience`` it throws `busy`.
    private static func withTableLock<R>(_ files: ContainerFiles, _ body: () throws -> R) throws -> R {
        // One descriptor for both: the lock is taken on the mapping's own (the mapping, and
        // so the descriptor and the lock, live until the end of this function).
        let releases = try MappedFile(files, relativePath: lockName, minimumSize: 64)
        return try withExtendedLifetime(releases) {
            try RingingFlock.withLock(
                releases.fd, releaseWord: releases.pointer.assumingMemoryBound(to: UInt32.self),
                patience: tableLockPatience, what: "locking the signal table",
                busy: { BatonError(.busy, "another process has held the lock of the signal table \(files.absolutePath(fileName)) for more than \(tableLockPatience); it may be stopped (SIGSTOP) in the middle of a rebuild. Retry later.") },
                body)
        }
    }

    private static func openValidTable(_ files: ContainerFiles, replacing retired: MappedFile? = nil, reason: String? = nil) throws -> MappedFile {
        if retired == nil, let map = try? MappedFile(files, relativePath: fileName, minimumSize: 0, create: false),
           map.size == fileSize, isValid(map), !isRetired(map) {
            return map
        }
        // Create or rebuild under the table lock (held for microseconds).
        return try withTableLock(files) { try createOrRebuild(files, replacing: retired, reason: reason) }
    }

    /// The rest of ``openValidTable(_:replacing:reason:)``, under the table lock.
    private static func createOrRebuild(_ files: ContainerFiles, replacing retired: MappedFile?, reason: String?) throws -> MappedFile {
        if let map = try? MappedFile(files, relativePath: fileName, minimumSize: 0, create: false),
           map.size == fileSize, isValid(map), !isRetired(map),
           retired.map({ $0.fd != map.fd && !sameFile($0, map) }) ?? true {
            return map
        }
        let temporary = fileName + ".new-\(baton_process_id())"
        _ = Sys.unlinkat(files.directory, temporary)
        let fresh: MappedFile
        do {
            fresh = try MappedFile(files, relativePath: temporary, minimumSize: fileSize)
        } catch {
            _ = Sys.unlinkat(files.directory, temporary) // e.g. noSpace: leave nothing behind
            throw error
        }
        let base = fresh.pointer
        base.storeBytes(of: magic.littleEndian, toByteOffset: 0, as: UInt64.self)
        base.storeBytes(of: version.littleEndian, toByteOffset: 8, as: UInt32.self)
        base.storeBytes(of: UInt32(slotCount).littleEndian, toByteOffset: 12, as: UInt32.self)
        base.storeBytes(of: UInt32(slotSize).littleEndian, toByteOffset: 16, as: UInt32.self)
        base.storeBytes(of: headerChecksum(base).littleEndian, toByteOffset: 20, as: UInt32.self)
        // Whatever table is in place now (even with a scribbled header) is retired so that every
        // process sleeping on it wakes up and moves to the new one. The offsets are fixed. A table
        // cut short by another program is first extended again (zeros) to its full size, so that
        // processes still mapping it neither fault nor sleep on a word nobody can retire.
        //
        // Retired first, then its names, counters and states carried over: a post checks the
        // retirement after it writes (``post(_:state:)``), so a post this copy may miss is made
        // again on the new table by its poster. Slots that fail their checks are dropped (and
        // counted in the report).
        if let current = try? MappedFile(files, relativePath: fileName, minimumSize: fileSize, create: false),
           current.size >= headerSize {
            baton_store32(word(current, 24), 1)
            wakeEveryone(current)
            let (carried, dropped) = carryOver(from: current, to: fresh)
            let lost = dropped > 0 ? "; \(dropped) slot\(dropped == 1 ? "" : "s") failed the checks and were dropped (their names start over at state 0)" : ""
            files.diagnostics.report(.signalTableRebuilt, level: .warning, "rebuilt the signal table \(files.absolutePath(fileName)): \(reason ?? "its header or size failed the checks"); carried \(carried) name\(carried == 1 ? "" : "s") over\(lost); every observer gets one delivery")
        }
        try Sys.renameat(files.directory, temporary, files.directory, fileName).get("installing the rebuilt signal table")
        return fresh
    }

    /// Copies every slot of `old` that passes its checks (name, counter, state; no observers:
    /// each process counts its own again as it moves) into `fresh`, which nobody else maps yet.
    /// Returns how many names were carried over and how many slots were dropped.
    static func carryOver(from old: MappedFile, to fresh: MappedFile) -> (carried: Int, dropped: Int) {
        var carried = 0
        var dropped = 0
        for slot in 0..<slotCount {
            let offset = headerSize + slot * slotSize
            guard offset + slotSize <= old.size else { break }
            let source = old.pointer.advanced(by: offset)
            let status = baton_load32(source.assumingMemoryBound(to: UInt32.self))
            if status == 0 { continue }
            let length = Int(UInt32(littleEndian: source.load(fromByteOffset: 4, as: UInt32.self)))
            guard status == 1, length >= 1, length <= Signals.maxNameBytes,
                  source.load(fromByteOffset: 36, as: UInt32.self) == slotChecksum(source, length: length) else {
                dropped += 1
                continue
            }
            let hash = source.load(fromByteOffset: 8, as: UInt64.self)
            var target = Int(hash % UInt64(slotCount))
            var placed = false
            for _ in 0..<slotCount {
                let destination = fresh.pointer.advanced(by: headerSize + target * slotSize)
                if destination.load(fromByteOffset: 0, as: UInt32.self) == 0 {
                    destination.advanced(by: 4).copyMemory(from: source.advanced(by: 4), byteCount: 12) // length, hash
                    destination.advanced(by: 36).copyMemory(from: source.advanced(by: 36), byteCount: 4 + length)
                    let counter = baton_load64(source.advanced(by: 16).assumingMemoryBound(to: UInt64.self))
                    let value = baton_load64(source.advanced(by: 24).assumingMemoryBound(to: UInt64.self))
                    destination.storeBytes(of: counter, toByteOffset: 16, as: UInt64.self)
                    destination.storeBytes(of: value, toByteOffset: 24, as: UInt64.self)
                    destination.storeBytes(of: UInt32(1), toByteOffset: 0, as: UInt32.self)
                    placed = true
                    break
                }
                // The same name twice (a scribbled table): the first copy wins.
                if destination.load(fromByteOffset: 8, as: UInt64.self) == hash,
                   destination.load(fromByteOffset: 4, as: UInt32.self) == UInt32(length),
                   memcmp(destination.advanced(by: 40), source.advanced(by: 40), length) == 0 {
                    break
                }
                target = (target + 1) % slotCount
            }
            if placed { carried += 1 } else { dropped += 1 }
        }
        return (carried, dropped)
    }

    /// Rings the shared word and every process's doorbell (a retired table: everyone moves on).
    private static func wakeEveryone(_ map: MappedFile) {
        baton_add32(word(map, 64), 1)
        AddressWait.wakeAll(word(map, 64))
        guard hasEntries(map) else { return }
        for index in 0..<entryCount {
            for doorbell in [word(map, entryOffset + index * entrySize + 4), groupWord(map, index)] {
                baton_add32(doorbell, 1)
                AddressWait.wakeAll(doorbell)
            }
        }
    }

    private static func sameFile(_ a: MappedFile, _ b: MappedFile) -> Bool {
        guard case .success(let x) = Sys.fstat(a.fd), case .success(let y) = Sys.fstat(b.fd) else { return false }
        return x.st_ino == y.st_ino && x.st_dev == y.st_dev
    }

    private static func headerChecksum(_ base: UnsafeMutableRawPointer) -> UInt32 {
        Checksum.crc32c(UnsafeRawBufferPointer(start: base, count: 20))
    }

    private static func isValid(_ map: MappedFile) -> Bool {
        let base = map.pointer
        return UInt64(littleEndian: base.load(fromByteOffset: 0, as: UInt64.self)) == magic
            && UInt32(littleEndian: base.load(fromByteOffset: 8, as: UInt32.self)) == version
            && UInt32(littleEndian: base.load(fromByteOffset: 12, as: UInt32.self)) == UInt32(slotCount)
            && UInt32(littleEndian: base.load(fromByteOffset: 16, as: UInt32.self)) == UInt32(slotSize)
            && UInt32(littleEndian: base.load(fromByteOffset: 20, as: UInt32.self)) == headerChecksum(base)
    }

    private static func isRetired(_ map: MappedFile) -> Bool {
        baton_load32(map.pointer.advanced(by: 24).assumingMemoryBound(to: UInt32.self)) != 0
    }

    /// Replaces a table that failed a check, then moves this process onto the new one.
    /// Must be called with `state` locked (passed in).
    private func rebuild(_ state: inout State, reason: String) throws {
        let old = state.map
        let fresh = try Self.openValidTable(files, replacing: old, reason: reason)
        if !Self.sameFile(old, fresh), !Self.isTruncated(old) {
            // Retire the old mapping so other processes move on, and wake their threads.
            baton_store32(Self.word(old, 24), 1)
            Self.wakeEveryone(old)
        }
        try moveToTable(&state, fresh)
    }

    /// Switches to `fresh`, re-registering observed names and giving each observer one delivery.
    private func moveToTable(_ state: inout State, _ fresh: MappedFile) throws {
        let wasWaiter = state.countedAsWaiter
        if wasWaiter, !Self.isTruncated(state.map) { baton_sub32(Self.word(state.map, 128), 1) }
        state.map = fresh
        state.slotCache.removeAll()
        state.entry = nil
        state.bitCounts = [Int](repeating: 0, count: Self.entryCount)
        if wasWaiter { baton_add32(Self.word(fresh, 128), 1) }
        if !state.observers.isEmpty { claimEntry(&state) }
        for (id, observed) in state.observers {
            guard let observer = observed.observer else { state.observers[id] = nil; continue }
            state.releasing.append(observer)
            let slot = try findOrCreateSlot(&state, observer.name)
            state.bitCounts[slot % Self.entryCount] += 1
            // Interest first, then the observer count and the baseline, as in `register`.
            if let entry = state.entry { baton_or64(entryInterest(state.map, entry), UInt64(1) << UInt64(slot % Self.entryCount)) }
            baton_add32(slotWord(state.map, slot, 32), 1)
            observed.slot = slot
            observed.lastSeen = baton_load64(slotCounter(state.map, slot))
            // Posts made meanwhile cannot be counted across tables: "more than one".
            observer.deliver(state: baton_load64(slotState(state.map, slot)), posts: 2)
        }
    }

    // MARK: Process entries

    /// Takes a free entry for this process (one with no owner, or whose owner died or
    /// suspended), resetting it. Without one, the thread sleeps on the shared word.
    private func claimEntry(_ state: inout State) {
        guard state.entry == nil, !state.suspended, Self.hasEntries(state.map),
              let token = try? owners.current() else { return }
        for index in 0..<Self.entryCount {
            let owner = entryToken(state.map, index)
            let current = baton_load64(owner)
            guard current == 0 || (current != token && !owners.isAlive(current)),
                  baton_cas64(owner, current, token) != 0 else { continue }
            baton_store64(entryInterest(state.map, index), 0)
            baton_store32(entryWord(state.map, index, 8), 0)
            baton_store32(entryWord(state.map, index, 0), UInt32(bitPattern: baton_process_id()))
            state.entry = index
            state.entryToken = token
            return
        }
    }

    // MARK: Suspension

    /// Notes the suspension: the container releases the owner token after this, so the entry
    /// reads as free to other processes from then on. It stays in use by this process meanwhile,
    /// so posts still ring its doorbell; if another process claims it, ``retakeLocks()`` claims
    /// another one.
    func releaseLocks() {
        withState { $0.suspended = true }
    }

    /// Takes the entry back with this process's new token (or claims another one if it was
    /// taken meanwhile), then has the signal thread look at every observed counter: posts made
    /// while the entry was someone else's are delivered then.
    func retakeLocks() {
        withState { state in
            state.suspended = false
            if let entry = state.entry {
                if let token = try? owners.current(),
                   baton_cas64(entryToken(state.map, entry), state.entryToken, token) != 0 {
                    // Ours again; another process may have reset it meanwhile.
                    state.entryToken = token
                    baton_store32(entryWord(state.map, entry, 0), UInt32(bitPattern: baton_process_id()))
                    baton_store64(entryInterest(state.map, entry), state.interest)
                    return
                }
                state.entry = nil
            }
            guard !state.observers.isEmpty else { return }
            claimEntry(&state)
            if let entry = state.entry { baton_store64(entryInterest(state.map, entry), state.interest) }
        }
        thread.wake(start: false)
    }

    private func entryWord(_ map: MappedFile, _ index: Int, _ offset: Int) -> UnsafeMutablePointer<UInt32> {
        Self.word(map, Self.entryOffset + index * Self.entrySize + offset)
    }
    private func entryInterest(_ map: MappedFile, _ index: Int) -> UnsafeMutablePointer<UInt64> {
        map.pointer.advanced(by: Self.entryOffset + index * Self.entrySize + 16).assumingMemoryBound(to: UInt64.self)
    }
    private func entryToken(_ map: MappedFile, _ index: Int) -> UnsafeMutablePointer<UInt64> {
        map.pointer.advanced(by: Self.entryOffset + index * Self.entrySize + 24).assumingMemoryBound(to: UInt64.self)
    }

    // MARK: Memory access

    /// The group word of interest bit `bit`.
    private static func groupWord(_ map: MappedFile, _ bit: Int) -> UnsafeMutablePointer<UInt32> {
        word(map, groupOffset + bit * groupStride)
    }

    private static func word(_ map: MappedFile, _ offset: Int) -> UnsafeMutablePointer<UInt32> {
        map.pointer.advanced(by: offset).assumingMemoryBound(to: UInt32.self)
    }
    private func slotBase(_ map: MappedFile, _ slot: Int) -> UnsafeMutableRawPointer {
        map.pointer.advanced(by: Self.headerSize + slot * Self.slotSize)
    }
    private func slotWord(_ map: MappedFile, _ slot: Int, _ offset: Int) -> UnsafeMutablePointer<UInt32> {
        slotBase(map, slot).advanced(by: offset).assumingMemoryBound(to: UInt32.self)
    }
    private func slotCounter(_ map: MappedFile, _ slot: Int) -> UnsafeMutablePointer<UInt64> {
        slotBase(map, slot).advanced(by: 16).assumingMemoryBound(to: UInt64.self)
    }
    private func slotState(_ map: MappedFile, _ slot: Int) -> UnsafeMutablePointer<UInt64> {
        slotBase(map, slot).advanced(by: 24).assumingMemoryBound(to: UInt64.self)
    }

    private static func hash(_ name: String) -> UInt64 { FNV1a.hash(name) }

    private static func slotChecksum(_ base: UnsafeMutableRawPointer, length: Int) -> UInt32 {
        var crc = Checksum.crc32c(UnsafeRawBufferPointer(start: base.advanced(by: 4), count: 12))
        crc = Checksum.crc32c(UnsafeRawBufferPointer(start: base.advanced(by: 40), count: length), seed: crc)
        return crc
    }

    private enum Lookup { case found(Int), empty(Int), full }

    /// Finds `name` by linear probing. Throws `corrupt` when a slot fails its checks.
    private func lookup(_ map: MappedFile, _ name: String) throws -> Lookup {
        let hash = Self.hash(name)
        let bytes = Array(name.utf8)
        var slot = Int(hash % UInt64(Self.slotCount))
        for _ in 0..<Self.slotCount {
            let base = slotBase(map, slot)
            let status = baton_load32(slotWord(map, slot, 0))
            switch status {
            case 0: return .empty(slot)
            case 1:
                let length = Int(base.load(fromByteOffset: 4, as: UInt32.self))
                guard length >= 1, length <= Signals.maxNameBytes,
                      base.load(fromByteOffset: 36, as: UInt32.self) == Self.slotChecksum(base, length: length) else {
                    throw BatonError(.corrupt, "signal table slot \(slot) failed its checksum")
                }
                if base.load(fromByteOffset: 8, as: UInt64.self) == hash, length == bytes.count,
                   memcmp(base.advanced(by: 40), bytes, length) == 0 {
                    return .found(slot)
                }
            default:
                throw BatonError(.corrupt, "signal table slot \(slot) has an unknown status \(status)")
            }
            slot = (slot + 1) % Self.slotCount
        }
        return .full
    }

    /// Finds the slot of `name`, creating it under the table lock. Rebuilds a corrupt table.
    private func findOrCreateSlot(_ state: inout State, _ name: String) throws -> Int {
        if let slot = state.slotCache[name] { return slot }
        for attempt in 0..<2 {
            do {
                if case .found(let slot) = try lookup(state.map, name) {
                    state.slotCache[name] = slot
                    return slot
                }
                let map = state.map
                let slot = try Self.withTableLock(files) { () throws -> Int in
                    switch try lookup(map, name) {
                    case .found(let slot):
                        return slot
                    case .full:
                        throw BatonError(.capacityExceeded, "the signal table of \(files.path) is full (\(Self.slotCount) names); use fewer distinct signal names")
                    case .empty(let slot):
                        let base = slotBase(map, slot)
                        let bytes = Array(name.utf8)
                        base.storeBytes(of: UInt32(bytes.count), toByteOffset: 4, as: UInt32.self)
                        base.storeBytes(of: Self.hash(name), toByteOffset: 8, as: UInt64.self)
                        bytes.withUnsafeBytes { base.advanced(by: 40).copyMemory(from: $0.baseAddress!, byteCount: bytes.count) }
                        base.storeBytes(of: Self.slotChecksum(base, length: bytes.count), toByteOffset: 36, as: UInt32.self)
                        baton_store32(slotWord(map, slot, 0), 1)
                        return slot
                    }
                }
                state.slotCache[name] = slot
                return slot
            } catch let error as BatonError where error.code == .corrupt && attempt == 0 {
                try rebuild(&state, reason: error.message)
            }
        }
        throw BatonError(.corrupt, "the signal table of \(files.path) stays corrupt after a rebuild")
    }

    /// Moves to a new table if the current one was retired by a rebuild in another process.
    ///
    /// Also moves on when the table file was cut short under this process (by another program:
    /// Baton never truncates it). The mapping guard (``MappingGuard``) turns a touch past the
    /// file's end into zeros instead of a `SIGBUS` and counts it, so the check is one load and
    /// no system call (``MappedFile/cutShortSinceLastCheck()``: the header word is read first,
    /// so a cut through the header is seen in this same call; a cut further in is seen after
    /// the touch that found it, at the end of its ``withState(_:)``). An unguarded mapping is
    /// checked with one `fstat` before it is touched.
    /// - Returns: Whether this process moved to another table.
    @discardableResult
    private func followRetirement(_ state: inout State) throws -> Bool {
        // A guarded mapping's header is read before the cut check, so that a cut through the
        // header is repaired and counted in time for it; an unguarded one is read only after
        // the check, which is what keeps that read from faulting.
        let retiredBeforeCheck = state.map.isGuarded ? Self.isRetired(state.map) : nil
        if state.map.cutShortSinceLastCheck() {
            // Extended again first (zeros; the guard did it already if it repaired), so that no
            // process that still maps it faults, then rebuilt: the old table is retired and
            // every process's thread woken to move on.
            let size = Int((try? Sys.fstat(state.map.fd).get("checking the signal table"))?.st_size ?? 0)
            try FileSpace.reserve(state.map.fd, from: size, to: state.map.size, path: Self.fileName)
            try rebuild(&state, reason: "the signal table was truncated")
            return true
        }
        guard retiredBeforeCheck ?? Self.isRetired(state.map) else { return false }
        try moveToTable(&state, try Self.openValidTable(files, replacing: state.map))
        return true
    }

    /// Whether the file behind `map` is shorter than the mapping (someone cut it short).
    private static func isTruncated(_ map: MappedFile) -> Bool {
        guard case .success(let info) = Sys.fstat(map.fd) else { return false }
        return Int(info.st_size) < map.size
    }

    // MARK: SignalBackend

    func post(_ name: String, state value: UInt64?) throws {
        handOverTrace("signal.post")
        defer { handOverTrace("signal.posted") }
        _ = try postCountingWakes(name, state: value)
    }

    /// Where this process's signal thread may sleep now, as posters read it from its entry
    /// (0: awake, 1: its doorbell, 2 + b: group word b), and its interest mask; `nil` without
    /// an entry (for tests).
    var entryForTesting: (sleeping: UInt32, interest: UInt64)? {
        state.withLock { state in
            state.entry.map { (baton_load32(entryWord(state.map, $0, 8)), baton_load64(entryInterest(state.map, $0))) }
        }
    }

    /// ``post(_:state:)``, returning how many wake calls it made (for tests).
    func postCountingWakes(_ name: String, state value: UInt64?) throws -> Int {
        // The words to wake once the lock is released, on the stack: at most one per entry (its
        // doorbell or its group word), and the table's sequence word.
        try withUnsafeTemporaryAllocation(of: UnsafeMutablePointer<UInt32>.self, capacity: Self.entryCount + 1) { doorbells in
            try post(name, state: value, doorbells: doorbells)
        }
    }

    private func post(_ name: String, state value: UInt64?, doorbells: UnsafeMutableBufferPointer<UnsafeMutablePointer<UInt32>>) throws -> Int {
        let (map, count, here) = try withState { state throws -> (MappedFile?, Int, Bool) in
            // A rebuild in another process retires the table, then carries its slots over: a
            // write that finds the table retired after it may have come after the copy, so it is
            // made again on the new table (a counter moved twice is one more delivery, never a
            // lost one). After a few rounds lost to rebuilds in a row, the write is made under
            // the table lock, which every rebuild holds: no retirement can come between its
            // check and the write.
            var slot = 0
            func write() {
                if let value { baton_store64(slotState(state.map, slot), value) }
                baton_add64(slotCounter(state.map, slot), 1)
            }
            try followRetirement(&state)
            for attempt in 0... {
                slot = try findOrCreateSlot(&state, name)
                if attempt < 4 {
                    write()
                    // Retired meanwhile, or cut short under the write: made again on the table
                    // this process moves to.
                    if try !followRetirement(&state) { break }
                } else {
                    let map = state.map
                    let written = try Self.withTableLock(files) { () -> Bool in
                        guard !Self.isRetired(map), !Self.isTruncated(map) else { return false }
                        write()
                        return true
                    }
                    if written { break }
                    try followRetirement(&state)
                }
            }
            state.postedBits |= UInt64(1) << UInt64(slot % Self.entryCount)
            guard baton_load32(slotWord(state.map, slot, 32)) > 0 else { return (nil, 0, false) }
            // Ring the doorbell of every other process interested in the slot's bit (counter
            // first, then the interest: an observer registering now sets its interest, then
            // reads the counter, so one of the two sees the other); wake those that may sleep,
            // on the word each sleeps on: its doorbell, or its group word, once for all the
            // processes of the group (rung only after its sleepers were looked at: a sleeper
            // reads the word before it says where it sleeps).
            var count = 0
            let bit = UInt64(1) << UInt64(slot % Self.entryCount)
            if Self.hasEntries(state.map) {
                var groups: UInt64 = 0
                for index in 0..<Self.entryCount where index != state.entry {
                    guard baton_load64(entryInterest(state.map, index)) & bit != 0,
                          baton_load64(entryToken(state.map, index)) != 0 else { continue }
                    let doorbell = entryWord(state.map, index, 4)
                    baton_add32(doorbell, 1)
                    let sleeping = baton_load32(entryWord(state.map, index, 8))
                    if sleeping == Self.sleepsOnDoorbell {
                        doorbells.initializeElement(at: count, to: doorbell)
                        count += 1
                    } else if sleeping >= Self.sleepsOnGroup, sleeping - Self.sleepsOnGroup < UInt32(Self.entryCount) {
                        groups |= UInt64(1) << UInt64(sleeping - Self.sleepsOnGroup)
                    }
                }
                while groups != 0 {
                    let group = Self.groupWord(state.map, groups.trailingZeroBitCount)
                    groups &= groups - 1
                    baton_add32(group, 1)
                    doorbells.initializeElement(at: count, to: group)
                    count += 1
                }
            }
            let sequence = Self.word(state.map, 64)
            baton_add32(sequence, 1)
            if baton_load32(Self.word(state.map, 128)) > 0 {
                doorbells.initializeElement(at: count, to: sequence)
                count += 1
            }
            return (state.map, count, state.bitCounts[slot % Self.entryCount] > 0)
        }
        withExtendedLifetime(map) {
            for index in 0..<count { AddressWait.wakeAll(doorbells[index]) }
        }
        // This process's own observers: delivered here rather than by waking its thread.
        if here { scan() }
        return count
    }

    func state(of name: String) throws -> UInt64 {
        try withState { state in
            try followRetirement(&state)
            let slot = try findOrCreateSlot(&state, name)
            return baton_load64(slotState(state.map, slot))
        }
    }

    func register(_ observer: SignalObserver) throws -> any SignalRegistration {
        let (id, moved) = try withState { state throws -> (UInt64, Bool) in
            var moved = try followRetirement(&state)
            let slot = try findOrCreateSlot(&state, observer.name)
            let hadEntry = state.entry != nil
            claimEntry(&state)
            if !hadEntry, state.entry != nil { moved = true }
            let bit = slot % Self.entryCount
            state.bitCounts[bit] += 1
            if state.bitCounts[bit] == 1 {
                if let entry = state.entry {
                    baton_or64(entryInterest(state.map, entry), UInt64(1) << UInt64(bit))
                    // A thread asleep on its doorbell stays there (it sleeps on a group word
                    // only with one interest bit): a post to the new bit rings that doorbell
                    // (the interest, set just now, comes before the baseline read below), and
                    // the round it wakes for delivers to this observer. Anywhere else (a group
                    // word, parked with nothing observed, in a round: 0) it goes round.
                    if baton_load32(entryWord(state.map, entry, 8)) != Self.sleepsOnDoorbell { moved = true }
                } else {
                    moved = true
                }
            }
            // Count as an observer of the slot first, then read the baseline: a post that
            // misses the observer count is already in the baseline.
            baton_add32(slotWord(state.map, slot, 32), 1)
            let baseline = baton_load64(slotCounter(state.map, slot))
            state.nextID += 1
            state.observers[state.nextID] = Observed(observer: observer, slot: slot, lastSeen: baseline)
            return (state.nextID, moved)
        }
        // The thread goes round only when where it sleeps may change: a new interest bit
        // (unless it sleeps on its doorbell, see above), a new entry or a new table (or its
        // first observer, which starts it). An observer in a bit already watched needs nothing:
        // a post to its name rings the word the thread sleeps on, and the round it wakes for
        // delivers to every observer that is behind. A wake would ring that word: its doorbell,
        // or a group word shared with the other processes asleep there. A role's holder starting
        // to watch for stop requests, at every grant, so woke its own thread and those processes
        // for nothing (3% of the processor samples of a preemption loop).
        if moved { thread.wake() }
        return Registration(table: self, id: id)
    }

    private struct Registration: SignalRegistration {
        let table: SignalTable
        let id: UInt64
        func cancel() { table.unregister(id) }
    }

    private func unregister(_ id: UInt64) {
        withState { state in
            guard let observed = state.observers.removeValue(forKey: id) else { return }
            // A truncated table is left alone (its pages would fault); it is rebuilt on next use.
            guard !Self.isTruncated(state.map) else { return }
            baton_sub32(slotWord(state.map, observed.slot, 32), 1)
            dropInterest(&state, slot: observed.slot)
        }
    }

    private func dropInterest(_ state: inout State, slot: Int) {
        let bit = slot % Self.entryCount
        state.bitCounts[bit] = max(state.bitCounts[bit] - 1, 0)
        if state.bitCounts[bit] == 0, let entry = state.entry {
            baton_and64(entryInterest(state.map, entry), ~(UInt64(1) << UInt64(bit)))
        }
    }

    // MARK: The signal thread (KernelWaitSource)

    /// One round of the signal thread (``KernelWaitThread``), before it sleeps: runs the queued
    /// jobs, then says where to sleep: the group word of its interest bit when all its names
    /// fall in one and this process never posted in it, its entry's doorbell otherwise (the
    /// table's sequence word when no entry was free), or nothing while nothing is observed.
    /// In the same pass under the lock it reads that word, says in the entry that it may sleep
    /// there, then compares the observed counters: a poster that misses the flag changed the
    /// word after it was read here, so the sleep ends at once. The deliveries (and the jobs they
    /// resume) run after the lock.
    ///
    /// A wake of this thread from within the process (a registration, a job for its executor)
    /// rings the word it sleeps on: on a group word, the other processes of the group go round
    /// once for nothing.
    func prepareToSleep() -> KernelWaitWatch? {
        _ = runJobs(on: jobExecutor)
        typealias Plan = (map: MappedFile, offset: Int, sleeping: UnsafeMutablePointer<UInt32>?, seen: UInt32)
        var deliveries: [Delivery] = []
        swap(&deliveries, &roundDeliveries)
        defer {
            // Emptied one by one: `removeAll(keepingCapacity:)` destroys the elements through
            // runtime type metadata.
            while deliveries.popLast() != nil {}
            swap(&deliveries, &roundDeliveries)
        }
        let plan = withState { state -> Plan? in
            while true {
                _ = try? followRetirement(&state) // a truncated table is extended before it is read
                let idle = state.observers.isEmpty
                let overflow = !idle && state.entry == nil
                if overflow != state.countedAsWaiter {
                    if overflow { baton_add32(Self.word(state.map, 128), 1) } else { baton_sub32(Self.word(state.map, 128), 1) }
                    state.countedAsWaiter = overflow
                }
                if idle { return nil }
                // The word to sleep on: the group word of the one interest bit this process
                // has (unless it posts in it), its doorbell when it has several, the shared
                // word without an entry.
                var offset = 64, sleepsOn: UInt32 = 0
                if let entry = state.entry {
                    let interest = baton_load64(entryInterest(state.map, entry))
                    if interest.nonzeroBitCount == 1, interest & state.postedBits == 0 {
                        offset = Self.groupOffset + interest.trailingZeroBitCount * Self.groupStride
                        sleepsOn = Self.sleepsOnGroup + UInt32(interest.trailingZeroBitCount)
                    } else {
                        offset = Self.entryOffset + entry * Self.entrySize + 4
                        sleepsOn = Self.sleepsOnDoorbell
                    }
                }
                let sleeping = state.entry.map { entryWord(state.map, $0, 8) }
                let seen = baton_load32(Self.word(state.map, offset))
                if let sleeping { baton_store32(sleeping, sleepsOn) }
                collectDeliveries(&state, into: &deliveries)
                // A touch above that found the file cut short (the guard put zeros back): no
                // sleep on a word of that table; the next pass rebuilds it.
                if !state.map.hasUncheckedRepair { return (state.map, offset, sleeping, seen) }
            }
        }
        guard let plan else { return nil }
        if let sleeping = plan.sleeping { sleepingFlag = (plan.map, sleeping) }
        if !deliveries.isEmpty {
            // The tasks these deliveries resume are queued (``enqueue(_:)``) while this thread
            // is marked as delivering, and run just below in this round: no wake of this
            // thread, which would cost a second round.
            let outer = baton_thread_context()
            baton_set_thread_context(threadExecutor.deliveringMarker)
            handOverTrace("signal.deliver")
            for delivery in deliveries { delivery.observer.deliver(state: delivery.state, posts: delivery.posts) }
            baton_set_thread_context(outer)
        }
        _ = runJobs(on: jobExecutor)
        return KernelWaitWatch(word: Self.word(plan.map, plan.offset), expected: plan.seen, generation: plan.seen, keepAlive: plan.map)
    }

    func roundEnded() {
        guard let flag = sleepingFlag else { return }
        baton_store32(flag.word, 0)
        sleepingFlag = nil
    }

    /// Runs every queued job; returns whether there were any.
    ///
    /// The queue is swapped with the emptied storage of the last batch, not copied and emptied:
    /// emptying an array whose storage is shared with the copy allocates new storage, twice a
    /// round, jobs or none; and a queue swapped with a fresh array would allocate at its next
    /// job.
    private func runJobs(on executor: UnownedTaskExecutor) -> Bool {
        var batch: [UnownedJob] = []
        swap(&batch, &spareJobs)
        let any = threadExecutor.take(into: &batch)
        for job in batch { job.runSynchronously(on: executor) }
        batch.removeAll(keepingCapacity: true)
        swap(&batch, &spareJobs)
        return any
    }

    /// How many rounds the signal thread went (for tests).
    var threadRounds: UInt64 { thread.rounds }

    /// Runs tasks on the signal thread (see ``Signals/executor``): the queue of their jobs,
    /// which the thread runs after each scan.
    let threadExecutor: SignalThreadExecutor
    var executor: any TaskExecutor { threadExecutor }
    /// ``threadExecutor`` as the jobs run on it (made once: a conversion looks up the
    /// executor's witness table, twice a round).
    private let jobExecutor: UnownedTaskExecutor

    private func scan() {
        let deliveries = withState { state -> [Delivery] in
            _ = try? followRetirement(&state) // a truncated table is extended before it is read
            var deliveries: [Delivery] = []
            collectDeliveries(&state, into: &deliveries)
            return deliveries
        }
        for delivery in deliveries { delivery.observer.deliver(state: delivery.state, posts: delivery.posts) }
    }

    /// Appends to `deliveries` the observers whose slot's counter moved, with the slot's state
    /// (read after the counter) and how far the counter moved. Runs under the lock; the caller
    /// delivers after it.
    ///
    /// Each entry advances in place (``Observed`` is a class), so the dictionary is never
    /// written in the loop and never copied. Only the observers that have something to deliver
    /// are loaded from their weak references (the strong references go out with the
    /// deliveries, so none dies under the lock); an observer gone meanwhile is dropped here (its
    /// `deinit` unregisters it anyway, this only covers the moment in between).
    private func collectDeliveries(_ state: inout State, into deliveries: inout [Delivery]) {
        var gone: [UInt64] = []
        for (id, observed) in state.observers {
            let counter = baton_load64(slotCounter(state.map, observed.slot))
            guard let (observer, posts) = observed.advance(to: counter) else { continue }
            if let observer {
                deliveries.append(Delivery(observer: observer, state: baton_load64(slotState(state.map, observed.slot)), posts: posts))
            } else {
                gone.append(id)
            }
        }
        for id in gone {
            guard let observed = state.observers.removeValue(forKey: id) else { continue }
            baton_sub32(slotWord(state.map, observed.slot, 32), 1)
            dropInterest(&state, slot: observed.slot)
        }
    }
}

/// A `TaskExecutor` that runs tasks on a process's signal thread, so a delivery resumes the
/// observing task without waking a second thread: the queue of their jobs, which the thread
/// runs in its rounds (``SignalTable/prepareToSleep()``).
///
/// It holds the queue and the thread, not the table: a task may keep the executor after the
/// table is gone (a weak reference to the table cost a weak load, on a side-table reference
/// count, per job). The table closes the queue when it goes; a job queued after that goes to
/// the global concurrent executor instead.
final class SignalThreadExecutor: TaskExecutor, Sendable {
    private struct Queue {
        var jobs: [UnownedJob] = []
        var open = true
    }

    private let queue = Mutex(Queue())
    private let thread: KernelWaitThread

    fileprivate init(thread: KernelWaitThread) { self.thread = thread }

    /// The thread context (``baton_thread_context()``) of the signal thread while it delivers.
    fileprivate var deliveringMarker: UnsafeMutableRawPointer { UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque()) }

    /// Queues a job and wakes the thread, or hands the job to the global executor once closed.
    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let queued = queue.withLock { queue -> Bool in
            guard queue.open else { return false }
            queue.jobs.append(job)
            return true
        }
        guard queued else {
            globalConcurrentExecutor.enqueue(job)
            return
        }
        // Queued by this thread's own deliveries (``SignalTable/prepareToSleep()``), which run
        // the queue next: nothing to wake.
        if baton_thread_context() == deliveringMarker { return }
        thread.wake()
    }

    /// Swaps the queued jobs with `batch` (empty, its storage kept for the queue); returns
    /// whether there were any.
    fileprivate func take(into batch: inout [UnownedJob]) -> Bool {
        queue.withLock { queue -> Bool in
            if queue.jobs.isEmpty { return false }
            swap(&batch, &queue.jobs)
            return true
        }
    }

    /// Closes the queue (its table is gone) and returns the jobs still in it.
    fileprivate func close() -> [UnownedJob] {
        queue.withLock { queue in
            queue.open = false
            defer { queue.jobs = [] }
            return queue.jobs
        }
    }
}
