import Baton
import CBatonShims

/// A fair (first come, first served) cross-process lock: a ticket queue in a file mapped by every
/// process of the container, woken through ``AddressWait`` (futex on Linux, `os_sync` on Apple
/// platforms).
///
/// SQLite's busy handler is unfair: a writer that sleeps between retries can lose the lock to the
/// same fast writer again and again (one writer got 1 commit in 5 s in measurements here). The
/// shared database takes a ticket here before `BEGIN IMMEDIATE`, so writers of every process are
/// served in arrival order.
///
/// Layout of `.baton/<name>` (fixed size, shared memory, atomics only):
/// ```
/// header (4096 bytes)
///   0   magic "BATNTKT2"   8 version
///   64  next      (u32) the ticket dispenser
///   128 serving   (u32) the ticket whose turn it is
///   256 sequence  (u64) bumped by the user of the lock (the shared database counts commits)
///   264 last pid  (u64) the process that bumped it last
///   320 hold      (u64) ticket << 32 | 1 while its holder works, | 2 while it keeps the turn idle
///   328 granted   (u64) monotonic ns when the ticket being served got its turn
///   336 activity  (u64) monotonic ns when its holder last went idle
///   344 watchers  (u32) a count kept by the user of the lock (the shared database counts the
///                 processes watching the commits of single tables)
///   352 progress  (u64) a word kept by the user of the lock (the shared database's checkpoint
///                 progress)
///   360 untracked (u64) a count kept by the user of the lock (the shared database counts the
///                 commits whose tables were not tracked)
/// slots (64 bytes each, ticket % slotCount)
///   0  owner (u64) ticket << 32 | pid; pid 0 means the ticket was abandoned (the pid is only
///      for messages)
///   8  wake  (u32) the word the ticket's waiter sleeps on
///   16 token (u64) the owner token (``OwnerTokens``) of the process that took the ticket,
///      written before `owner`
/// ```
///
/// Keeping the turn: a holder that will likely use the lock again soon (the shared database after
/// a commit) may ``keep(_:)`` its ticket instead of releasing it and ``resume(_:)`` it later with
/// one atomic compare-and-swap: with several writers, the lock changes hands once per
/// ``quantum`` instead of once per commit, so their total throughput stays that of one writer
/// instead of paying a cross-process wake-up per commit. A kept turn is revocable: while nobody
/// waits it lasts; once someone waits, the holder gives it up at the end of the first use after
/// its quantum (``shouldYield(_:)``), and the first waiter takes it over by itself (one
/// compare-and-swap) when the holder has been idle for ``idleLimit`` or its quantum is over, so a
/// holder that stopped writing, or was stopped (SIGSTOP), delays the queue by at most that.
///
/// Crash safety: a ticket records its owner's token (``OwnerTokens``), whose `flock` the kernel
/// releases when the owner dies or suspends. A waiter watches the token of the process whose turn
/// it is: the release rings the waiter's word, and it skips a dead owner's ticket at once, with no
/// timer. (A ticket taken but never claimed, its owner killed between the two stores, is skipped
/// after ``livenessInterval``: the only timed check.) A waiter that gives up (deadline,
/// cancellation, suspension) abandons its ticket, and whoever serves it skips it.
///
/// Waiting blocks the calling thread in the kernel (``AddressWait``): call it from a thread that
/// may block, such as a database's writer queue, like SQLite's own busy handler does.
package final class TicketLock: Sendable {
    static let magic: UInt64 = 0x3254_4B54_4E54_4142 // "BATNTKT2" little-endian (owner tokens)
    static let version: UInt32 = 2
    static let headerSize = 4096
    static let slotSize = 64
    /// How many tickets may be outstanding at once (one per waiting writer of every process).
    package static let slotCount = 256
    static let fileSize = headerSize + slotSize * slotCount
    static let nextOffset = 64, servingOffset = 128, sequenceOffset = 256, lastPIDOffset = 264
    static let holdOffset = 320, grantedOffset = 328, activityOffset = 336, watchersOffset = 344, progressOffset = 352
    static let untrackedOffset = 360
    static let holdActive: UInt64 = 1, holdKept: UInt64 = 2

    /// How long a kept turn lasts once others wait.
    package static let quantum: Duration = .milliseconds(8)
    /// How long a kept turn may stay idle once others wait.
    package static let idleLimit: Duration = .microseconds(200)

    /// How long a ticket may stay taken but unclaimed (its owner killed between taking and
    /// recording it) before waiters skip it.
    package static let livenessInterval: Duration = .milliseconds(100)

    private let map: MappedFile
    private let owners: OwnerTokens
    private let diagnostics: Diagnostics
    /// This process's id, recorded in the tickets it takes for messages (read once: `getpid` is a
    /// system call).
    private let pid = UInt32(bitPattern: baton_process_id())
    /// The lock file's path relative to `.baton`.
    package let name: String

    /// A ticket that holds the lock until ``release(_:)``.
    package struct Ticket: Sendable, Hashable {
        /// The ticket's number.
        package let number: UInt32
    }

    /// Opens (creating it if needed) the ticket queue `.baton/<name>`.
    /// - Throws: `invalidName`, `corrupt` when the file exists with another format, file errors.
    package init(_ container: SharedContainer, name: String) throws {
        let components = name.split(separator: "/", omittingEmptySubsequences: false)
        var directory = ""
        for component in components {
            try SharedContainer.validateName(String(component), what: "a ticket lock name component")
        }
        for component in components.dropLast() {
            directory += directory.isEmpty ? String(component) : "/" + component
            try container.makeDirectory(directory)
        }
        let map = try MappedFile(container, relativePath: name, minimumSize: Self.fileSize)
        guard map.size >= Self.fileSize else {
            throw BatonError(.corrupt, "the ticket queue \(name) is \(map.size) bytes, expected \(Self.fileSize); remove it (it holds no data) and retry")
        }
        let magicWord = map.pointer.assumingMemoryBound(to: UInt64.self)
        // A new file is all zeros: stamp it. Tickets start at 0 either way.
        if baton_load64(magicWord) == 0 {
            _ = baton_cas64(magicWord, 0, Self.magic)
            baton_store32(map.pointer.advanced(by: 8).assumingMemoryBound(to: UInt32.self), Self.version)
        }
        guard baton_load64(magicWord) == Self.magic else {
            throw BatonError(.corrupt, "the ticket queue \(name) has an unknown format; remove it (it holds no data) and retry")
        }
        self.map = map
        self.name = name
        self.owners = container.owners
        self.diagnostics = container.diagnostics
    }

    private func word32(_ offset: Int) -> UnsafeMutablePointer<UInt32> {
        map.pointer.advanced(by: offset).assumingMemoryBound(to: UInt32.self)
    }

    private func word64(_ offset: Int) -> UnsafeMutablePointer<UInt64> {
        map.pointer.advanced(by: offset).assumingMemoryBound(to: UInt64.self)
    }

    private func owner(_ ticket: UInt32) -> UnsafeMutablePointer<UInt64> {
        word64(Self.headerSize + Int(ticket % UInt32(Self.slotCount)) * Self.slotSize)
    }

    private func wakeWord(_ ticket: UInt32) -> UnsafeMutablePointer<UInt32> {
        word32(Self.headerSize + Int(ticket % UInt32(Self.slotCount)) * Self.slotSize + 8)
    }

    private func tokenWord(_ ticket: UInt32) -> UnsafeMutablePointer<UInt64> {
        word64(Self.headerSize + Int(ticket % UInt32(Self.slotCount)) * Self.slotSize + 16)
    }

    /// Wakes the owner of `ticket` (its slot's word).
    private func wake(_ ticket: UInt32) {
        baton_add32(wakeWord(ticket), 1)
        AddressWait.wakeAll(wakeWord(ticket))
    }

    /// Takes a ticket and waits for its turn, blocking the calling thread.
    ///
    /// - Parameters:
    ///   - deadline: When to give up: the ticket is abandoned and `busy` thrown, naming the
    ///     process whose turn it is.
    ///   - interruption: Checked on every wake-up; return a non-nil error to stop waiting (the
    ///     ticket is abandoned and the error thrown). Call ``interruptWaiters()`` to wake waiters so
    ///     they check it.
    /// - Returns: The held ticket; pass it to ``release(_:)``.
    /// - Throws: `busy` at the deadline, or the interruption's error.
    package func acquire(deadline: Deadline, interruption: () -> (any Error)?) throws -> Ticket {
        let started = ContinuousClock.now
        // Another program may have cut the file short: extend it before touching the mapping.
        try map.restoreTruncatedSize()
        var number = try takeTicket()
        let serving = word32(Self.servingOffset)
        var unclaimedSince: (ticket: UInt32, at: ContinuousClock.Instant)?
        // The token of the process whose turn it is, watched while we wait: its release (death,
        // suspension) rings our word.
        var watched: (token: UInt64, subscription: FileEvents.Subscription?)?
        defer { withExtendedLifetime(watched) {} }
        while true {
            let seen = baton_load32(wakeWord(number))
            let current = baton_load32(serving)
            if current == number { return begin(number) }
            if let error = interruption() {
                abandon(number)
                throw error
            }
            if deadline.hasPassed {
                abandon(number)
                let holder = holderPID(of: current)
                let waited = (ContinuousClock.now - started).seconds
                throw BatonError(
                    .busy,
                    "waited \(Int(waited * 1000)) ms in the writer queue \(name); \(holder.map { "process \($0)" } ?? "another process") is still writing. Retry later or raise the busy timeout",
                    cause: holder.map { HolderProcess(pid: $0) }
                )
            }
            if Int32(bitPattern: current &- number) > 0 {
                if Int32(bitPattern: current &- baton_load32(word32(Self.nextOffset))) > 0 {
                    // `serving` is past the dispenser, which no sequence of turns does (both only
                    // grow, `serving` up to `next`): the file was damaged. Serve our ticket, the
                    // newest, instead of queueing again for ever.
                    _ = baton_cas32(serving, current, number)
                    continue
                }
                // Our ticket was skipped (we looked dead: suspended, or never claimed in time).
                // Queue again.
                number = try takeTicket()
                continue
            }
            // Is the process whose turn it is alive? (Watch first, then check: a death in between
            // rings our word.)
            var slice = deadline.remaining
            let record = baton_load64(owner(current))
            if UInt32(truncatingIfNeeded: record >> 32) == current {
                unclaimedSince = nil
                if UInt32(truncatingIfNeeded: record) == 0 {
                    advance(from: current) // abandoned
                    continue
                }
                let token = baton_load64(tokenWord(current))
                if watched?.token != token {
                    let word = WakeWord(pointer: wakeWord(number), map: map)
                    watched = (token, owners.watch(token) { word.ring() })
                }
                if !owners.isAlive(token) {
                    diagnostics.report(.deadTicketSkipped, "writer queue \(name): skipped ticket \(current), whose writer is dead, suspended or gone")
                    advance(from: current)
                    continue
                }
            } else {
                // Taken but not claimed yet: its owner is between two stores, or died there.
                if let since = unclaimedSince, since.ticket == current {
                    if ContinuousClock.now - since.at >= Self.livenessInterval {
                        skipUnclaimed(from: current, before: number)
                        continue
                    }
                } else {
                    unclaimedSince = (current, ContinuousClock.now)
                }
                slice = slice.map { min($0, Self.livenessInterval) } ?? Self.livenessInterval
            }
            // The first waiter takes over a kept turn that has run out, and otherwise sleeps only
            // until it may (the holder's release wakes it sooner).
            if isFirstWaiter(number, serving: current) {
                switch takeOverKeptTurn(current) {
                case .taken: continue
                case .notBefore(let instant):
                    if let instant {
                        let now = baton_monotonic_ns()
                        let until = Duration.nanoseconds(Int64(instant > now ? instant - now : 0))
                        slice = slice.map { min($0, until) } ?? until
                    }
                }
            }
            let timeout = slice.map { max($0.nanoseconds, 0) } ?? -1
            _ = AddressWait.wait(on: wakeWord(number), expecting: seen, timeoutNanoseconds: timeout)
        }
    }

    /// Rings a waiter's word from a death watch, keeping the queue's file mapped meanwhile.
    private struct WakeWord: @unchecked Sendable {
        // @unchecked: `pointer` stays mapped while `map` lives; touched with atomics only.
        let pointer: UnsafeMutablePointer<UInt32>
        let map: MappedFile
        func ring() {
            withExtendedLifetime(map) {
                baton_add32(pointer, 1)
                AddressWait.wakeAll(pointer)
            }
        }
    }

    /// Takes the lock only if nobody holds or waits for it; never blocks.
    /// - Returns: The held ticket, or `nil` when another ticket is outstanding.
    package func tryAcquire() -> Ticket? {
        guard let token = try? owners.current(), (try? map.restoreTruncatedSize()) != nil else { return nil }
        let next = word32(Self.nextOffset)
        let number = baton_load32(next)
        guard baton_load32(word32(Self.servingOffset)) == number, baton_cas32(next, number, number &+ 1) != 0 else {
            return nil
        }
        claim(number, token: token)
        return begin(number)
    }

    /// Records the start of `number`'s turn.
    private func begin(_ number: UInt32) -> Ticket {
        baton_store64(word64(Self.grantedOffset), baton_monotonic_ns())
        baton_store64(word64(Self.holdOffset), UInt64(number) << 32 | Self.holdActive)
        // The next waiter slept while others were ahead of it, or looked while this turn had
        // not begun (no hold to time a take-over by): wake it to look again, so that it sleeps
        // only until it may take over a kept turn that runs out.
        let next = number &+ 1
        if next != baton_load32(word32(Self.nextOffset)) { wake(next) }
        return Ticket(number: number)
    }

    // MARK: Keeping the turn

    /// Keeps a held ticket's turn while idle, instead of releasing it: ``resume(_:)`` takes it
    /// back cheaply unless a waiter took it over meanwhile (see the type's documentation).
    package func keep(_ ticket: Ticket) {
        baton_store64(word64(Self.activityOffset), baton_monotonic_ns())
        _ = baton_cas64(word64(Self.holdOffset), UInt64(ticket.number) << 32 | Self.holdActive, UInt64(ticket.number) << 32 | Self.holdKept)
    }

    /// Takes back a kept turn. Returns `false` when a waiter took it over (the ticket is gone:
    /// queue again with ``acquire(deadline:interruption:)``).
    package func resume(_ ticket: Ticket) -> Bool {
        let kept = UInt64(ticket.number) << 32 | Self.holdKept
        guard baton_cas64(word64(Self.holdOffset), kept, UInt64(ticket.number) << 32 | Self.holdActive) != 0 else { return false }
        return baton_load32(word32(Self.servingOffset)) == ticket.number
    }

    /// Whether the holder of `ticket` should release it now rather than keep it: someone waits
    /// and the turn has lasted its ``quantum``.
    package func shouldYield(_ ticket: Ticket) -> Bool {
        guard baton_load32(word32(Self.nextOffset)) != ticket.number &+ 1 else { return false }
        return baton_monotonic_ns() &- baton_load64(word64(Self.grantedOffset)) >= UInt64(Self.quantum.nanoseconds)
    }

    /// Releases a kept turn if it is still kept (suspension, closing). Returns whether it was.
    @discardableResult
    package func releaseKept(_ ticket: Ticket) -> Bool {
        guard baton_cas64(word64(Self.holdOffset), UInt64(ticket.number) << 32 | Self.holdKept, 0) != 0 else { return false }
        advance(from: ticket.number)
        return true
    }

    private enum TakeOver { case taken, notBefore(UInt64?) }

    /// Takes over the kept turn of ticket `current` once it ran out (idle for ``idleLimit``, or
    /// past its ``quantum``), or says when it will have.
    private func takeOverKeptTurn(_ current: UInt32) -> TakeOver {
        let hold = baton_load64(word64(Self.holdOffset))
        let quantumEnd = baton_load64(word64(Self.grantedOffset)) &+ UInt64(Self.quantum.nanoseconds)
        guard hold == UInt64(current) << 32 | Self.holdKept else {
            // Working (or between owners): its holder yields at the end of the use that
            // crosses the quantum, and may keep the turn idle only until then.
            return .notBefore(hold >> 32 == UInt64(current) ? quantumEnd : nil)
        }
        let idleEnd = baton_load64(word64(Self.activityOffset)) &+ UInt64(Self.idleLimit.nanoseconds)
        let due = min(idleEnd, quantumEnd)
        guard baton_monotonic_ns() >= due else { return .notBefore(due) }
        guard baton_cas64(word64(Self.holdOffset), hold, 0) != 0 else { return .notBefore(nil) }
        advance(from: current)
        return .taken
    }

    /// Whether `number` is the first live ticket after `current` (the tickets between were
    /// abandoned).
    ///
    /// A ticket between whose owner died (its token released) is abandoned on the way: otherwise
    /// a waiter killed while a holder kept its turn idle would leave the waiters behind it asleep
    /// until the holder writes again, however long that is (the holder, alive and idle, would be
    /// named as "still writing" at their deadline).
    private func isFirstWaiter(_ number: UInt32, serving current: UInt32) -> Bool {
        var ticket = current &+ 1
        for _ in 0..<8 {
            if ticket == number { return true }
            let record = baton_load64(owner(ticket))
            guard UInt32(truncatingIfNeeded: record >> 32) == ticket else { return false } // not claimed yet
            if UInt32(truncatingIfNeeded: record) != 0 {
                guard !owners.isAlive(baton_load64(tokenWord(ticket))) else { return false }
                if baton_cas64(owner(ticket), record, UInt64(ticket) << 32) != 0 { // abandoned by its death
                    diagnostics.report(.deadTicketSkipped, "writer queue \(name): abandoned ticket \(ticket) of a dead writer waiting ahead of this one")
                }
            }
            ticket &+= 1
        }
        return false
    }

    /// Takes the next ticket and records this process as its owner.
    /// - Throws: `suspended` while the container is suspended (no owner token).
    private func takeTicket() throws -> UInt32 {
        let token = try owners.current()
        let number = baton_add32(word32(Self.nextOffset), 1)
        claim(number, token: token)
        return number
    }

    /// Records the owner of a ticket: the token first, then the record that says it is claimed.
    private func claim(_ number: UInt32, token: UInt64) {
        baton_store64(tokenWord(number), token)
        baton_store64(owner(number), UInt64(number) << 32 | UInt64(pid))
    }

    /// Releases a held ticket (kept or not): the next ticket's owner is woken.
    package func release(_ ticket: Ticket) {
        let hold = word64(Self.holdOffset)
        let current = baton_load64(hold)
        if current >> 32 == UInt64(ticket.number) { _ = baton_cas64(hold, current, 0) }
        advance(from: ticket.number)
    }

    /// Bumps the shared sequence number (the shared database counts commits with it) and records
    /// this process as the last one to bump it. Returns the new value.
    @discardableResult
    package func bumpSequence() -> UInt64 {
        let value = baton_add64(word64(Self.sequenceOffset), 1) &+ 1
        baton_store64(word64(Self.lastPIDOffset), UInt64(pid))
        return value
    }

    /// A count shared by every process, kept by the user of the lock (the shared database
    /// counts the processes that watch the commits of single tables, so that writers track
    /// which tables they change only while someone cares).
    package var watcherCount: UInt32 { baton_load32(word32(Self.watchersOffset)) }

    /// Adds one to ``watcherCount``.
    package func addWatcher() { baton_add32(word32(Self.watchersOffset), 1) }

    /// Removes one from ``watcherCount`` (never below zero).
    package func removeWatcher() {
        let word = word32(Self.watchersOffset)
        while true {
            let value = baton_load32(word)
            if value == 0 || baton_cas32(word, value, value - 1) != 0 { return }
        }
    }

    /// A 64-bit word shared by every process, kept by the user of the lock (the shared database
    /// records its checkpoint progress in it). Zero in a new queue.
    package var progress: UInt64 { baton_load64(word64(Self.progressOffset)) }

    /// Sets ``progress`` to `new` if it is still `expected` (compare-and-swap). Returns whether it was.
    @discardableResult
    package func updateProgress(from expected: UInt64, to new: UInt64) -> Bool {
        baton_cas64(word64(Self.progressOffset), expected, new) != 0
    }

    /// A count shared by every process, kept by the user of the lock (the shared database counts
    /// the commits made without tracking which tables they changed). Zero in a new queue.
    package var untrackedCount: UInt64 { baton_load64(word64(Self.untrackedOffset)) }

    /// Adds one to ``untrackedCount``.
    package func bumpUntracked() { _ = baton_add64(word64(Self.untrackedOffset), 1) }

    /// The shared sequence number.
    package var sequence: UInt64 { baton_load64(word64(Self.sequenceOffset)) }

    /// The process that bumped the sequence last.
    package var lastSequencePID: Int32 {
        Int32(truncatingIfNeeded: baton_load64(word64(Self.lastPIDOffset)))
    }

    /// The process whose turn it is, if a ticket is being served by a live process.
    package var holder: Int32? {
        holderPID(of: baton_load32(word32(Self.servingOffset)))
    }

    /// Wakes every waiter of this process so that it checks its interruption (for suspension
    /// and cancellation). Waiters of other processes wake too and go back to sleep.
    package func interruptWaiters() {
        for slot in 0..<UInt32(Self.slotCount) { wake(slot) }
    }

    // MARK: Internals

    private func holderPID(of ticket: UInt32) -> Int32? {
        let record = baton_load64(owner(ticket))
        guard UInt32(truncatingIfNeeded: record >> 32) == ticket else { return nil }
        let pid = Int32(bitPattern: UInt32(truncatingIfNeeded: record))
        return pid == 0 ? nil : pid
    }

    /// Gives up a ticket: whoever serves it skips it; if it is being served now, skip it here.
    private func abandon(_ number: UInt32) {
        baton_store64(owner(number), UInt64(number) << 32)
        if baton_load32(word32(Self.servingOffset)) == number { advance(from: number) }
    }

    /// Moves `serving` from `current`, a ticket taken but not claimed within the liveness
    /// interval, past every ticket before `limit` (the caller's own) that nobody claimed, in one
    /// step: to the first ticket after `current` whose slot records it. A dispenser or `serving`
    /// word changed by another program leaves thousands of tickets that nobody took, which one
    /// liveness interval each would take hours to pass; a crash between taking and claiming
    /// leaves one. (At most ``slotCount`` tickets are outstanding, so the slots name them all.)
    private func skipUnclaimed(from current: UInt32, before limit: UInt32) {
        let span = limit &- current
        var target = limit
        for slot in 0..<Self.slotCount {
            let record = baton_load64(word64(Self.headerSize + slot * Self.slotSize))
            let ticket = UInt32(truncatingIfNeeded: record >> 32)
            let distance = ticket &- current
            guard Int(ticket % UInt32(Self.slotCount)) == slot, UInt32(truncatingIfNeeded: record) != 0, distance > 0, distance < span, distance < target &- current else { continue }
            target = ticket
        }
        if target &- current > 1 {
            diagnostics.report(.deadTicketSkipped, level: .warning, "writer queue \(name): skipped \(target &- current) tickets from \(current) that no process claimed (the queue's words were changed by another program, or a writer died taking a ticket)")
        }
        if baton_cas32(word32(Self.servingOffset), current, target) != 0 { wake(target) }
    }

    /// Moves `serving` from `number` to the next ticket that is not abandoned, and wakes its owner.
    /// Does nothing when `serving` already moved past `number` (someone else advanced it).
    private func advance(from number: UInt32) {
        let serving = word32(Self.servingOffset)
        // Its turn is over: its record says so (as an abandoned one does), so that a `serving`
        // word moved back by another program never waits for this ticket's live owner again.
        // (A compare-and-swap: the slot may hold a newer ticket already.)
        let record = baton_load64(owner(number))
        if UInt32(truncatingIfNeeded: record >> 32) == number, UInt32(truncatingIfNeeded: record) != 0 {
            _ = baton_cas64(owner(number), record, UInt64(number) << 32)
        }
        var current = number
        while baton_cas32(serving, current, current &+ 1) != 0 {
            current &+= 1
            let record = baton_load64(owner(current))
            let abandoned = UInt32(truncatingIfNeeded: record >> 32) == current && UInt32(truncatingIfNeeded: record) == 0
            if !abandoned {
                // Its owner's turn begins (and wakes the ticket after it: see `begin`).
                wake(current)
                return
            }
        }
    }
}
