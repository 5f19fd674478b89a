import CBatonShims
import Synchronization

/// The claim words of parties waiting on rendezvous channels: the cross-process form of Go's
/// `selectDone`.
///
/// A `select` (or a plain rendezvous `send`/`receive`, a select of one case) that is about to wait
/// takes a *record* here and sets its claim word to "waiting"; it then registers the record in
/// each rendezvous channel it receives from (a slot in the channel's header) and offers an
/// element, tagged with the record, on each rendezvous channel it sends to. A counterpart may
/// complete that waiter only by compare-and-swapping the claim word from "waiting" to "claimed
/// by case i", under the lock of the channel of case i: a `trySend` then appends an element
/// addressed to the waiter, a receiver takes the waiter's offered element. Exactly one such swap
/// succeeds, so a select completes exactly one case; the waiter itself swaps "waiting" to
/// "cancelled" before it does anything else (before it takes or sends in another channel, on a
/// timeout, on cancellation), so nothing can complete it afterwards.
///
/// File `.baton/channel-waiters` (one per container; an in-process table for in-process
/// channels), records of 16 bytes (record 0 holds a magic number):
/// ```
/// 0 u64 claim   bits 62-63 state (0 free, 1 waiting, 2 claimed, 3 cancelled: idle),
///               bits 32-61 generation, bits 0-31 the case index when claimed
/// 8 u64 owner   the owner token (``OwnerTokens``) of the process using the record
/// ```
/// A record whose owner died (or suspended) is taken over by the next process that needs one,
/// with the next generation: what referred to the old generation is stale. An element addressed
/// to a dead (or stale) waiter is an orphan that any receiver takes, so an element whose
/// `trySend` succeeded is never lost; an element offered by a dead (or stale) waiter is dropped,
/// since its send never completed.
///
/// A counterpart checks that a waiter's owner lives (``OwnerTokens/isAlive(_:)``, a `flock`
/// system call) at most once per ``defaultLivenessWindow`` (1 ms) for the same owner: a waiter seen alive
/// less than that ago counts as alive. A process that died within the window is treated as one
/// that dies right after it was claimed, a case the rules above already cover: the element
/// handed to it is an orphan that the next receiver takes (nothing is lost), and an offer it
/// made may still be taken (at most once). The check inside the channel's critical section was
/// one system call per hop of a conversation, and a point where the scheduler preempted the
/// lock's holder.
final class ChannelWaiterTable: @unchecked Sendable {
    // @unchecked: `base` points into `memory` (mapped or allocated for the table's lifetime) and
    // is touched only with atomics; `idle` is a Mutex.
    static let recordSize = 16
    static let recordCount = 4096
    static let size = recordSize * recordCount
    static let fileName = "channel-waiters"
    static let magic: UInt64 = 0x3157_5443_4E54_4142 // "BATNCTW1" little-endian

    /// A record held for one wait: its index and the generation of that wait.
    struct Waiter: Sendable, Equatable {
        let index: Int
        let generation: UInt32
        /// How frames and channel headers refer to the waiter.
        var reference: UInt64 { UInt64(index) << 32 | UInt64(generation) }
        init(index: Int, generation: UInt32) { self.index = index; self.generation = generation }
        init(reference: UInt64) { index = Int(reference >> 32); generation = UInt32(truncatingIfNeeded: reference) }
    }

    enum State: UInt64 { case free = 0, waiting = 1, claimed = 2, cancelled = 3 }

    private let memory: ChannelHeaderMemory
    private let base: UnsafeMutableRawPointer
    /// The owner tokens of the container this table belongs to: its records carry them, and the
    /// container's suspension releases them (nil in process: token 1, always alive).
    private let owners: OwnerTokens?
    /// Records this container object owns and does not use now (under its current token, unless
    /// a suspension released that token since: ``begin()`` checks).
    private let idle = Mutex<[Int]>([])
    /// Owners recently seen alive, with when (``baton_monotonic_ns()``): see ``livenessWindow``.
    private let seenAlive = Mutex<[(token: UInt64, at: UInt64)]>([])

    /// How long an owner seen alive counts as alive without another check (nanoseconds).
    static let defaultLivenessWindow: UInt64 = 1_000_000
    /// This table's window: ``defaultLivenessWindow``, or longer in a test (a killed waiter
    /// then looks alive for as long as it takes to observe what a send does with it).
    let livenessWindow = Atomic<UInt64>(ChannelWaiterTable.defaultLivenessWindow)
    /// How many owners ``seenAlive`` remembers (the processes one talks to at once).
    private static let seenAliveLimit = 8

    private init(memory: ChannelHeaderMemory, owners: OwnerTokens?) {
        self.memory = memory
        self.base = memory.pointer
        self.owners = owners
    }

    /// The table of the in-process channels.
    static let inProcess = ChannelWaiterTable(memory: ChannelHeaderMemory(allocating: size), owners: nil)

    /// Maps (creating when missing) the container's `.baton/channel-waiters`, for the container
    /// object whose ``OwnerTokens`` are `owners`.
    ///
    /// One per container object, made on first use and kept by it (``SharedContainer``'s
    /// `channelWaiters`); it holds the container's owner tokens and its own mapping, never the
    /// container, and goes with it. Not one per path for the process: a second container object on the same
    /// directory (an app that drops and reopens its container) must record its own token, which
    /// its own suspension releases, and a dropped container's token and mapping must go with it.
    init(files: ContainerFiles, owners: OwnerTokens) throws {
        let file = try files.openDescriptor(Self.fileName, flags: O_RDWR | O_CREAT)
        let fd = file.rawValue
        try Sys.flock(fd, LOCK_EX).get("locking \(Self.fileName) to open it")
        defer { _ = Sys.flock(fd, LOCK_UN) }
        let current = Int(try Sys.fstat(fd).get("checking \(Self.fileName)").st_size)
        if current < Self.size { try FileSpace.reserve(fd, from: current, to: Self.size, path: Self.fileName) }
        let mapped = try Sys.mmap(fd, size: Self.size, writable: true).get("mapping \(Self.fileName)")
        memory = ChannelHeaderMemory(mapped: mapped, size: Self.size)
        base = mapped
        self.owners = owners
        let magicWord = word(0, 0)
        if baton_load64(magicWord) != Self.magic.littleEndian {
            // Zeroed (new) or damaged: records are self-checking (owner liveness, generation).
            baton_store64(magicWord, Self.magic.littleEndian)
        }
    }

    private func word(_ index: Int, _ offset: Int) -> UnsafeMutablePointer<UInt64> {
        base.advanced(by: index * Self.recordSize + offset).assumingMemoryBound(to: UInt64.self)
    }
    private func cas(_ pointer: UnsafeMutablePointer<UInt64>, _ expected: UInt64, _ desired: UInt64) -> Bool {
        baton_cas64(pointer, expected, desired) != 0
    }
    private func claimWord(_ index: Int) -> UnsafeMutablePointer<UInt64> { word(index, 0) }
    private func ownerWord(_ index: Int) -> UnsafeMutablePointer<UInt64> { word(index, 8) }

    static func claim(_ state: State, _ generation: UInt32, case index: UInt32 = 0) -> UInt64 {
        state.rawValue << 62 | UInt64(generation & 0x3FFF_FFFF) << 32 | UInt64(index)
    }
    static func state(_ claim: UInt64) -> State { State(rawValue: claim >> 62)! }
    static func generation(_ claim: UInt64) -> UInt32 { UInt32(truncatingIfNeeded: claim >> 32) & 0x3FFF_FFFF }

    private func currentToken() throws -> UInt64 { try owners?.current() ?? 1 }
    private func isAlive(_ token: UInt64) -> Bool { owners?.isAlive(token) ?? (token == 1) }

    /// ``isAlive(_:)`` for a counterpart's waiter, at most one check per ``livenessWindow`` for
    /// the same owner (see the type's discussion).
    private func isRecentlyAlive(_ token: UInt64) -> Bool {
        guard let owners else { return token == 1 }
        let now = baton_monotonic_ns()
        let window = livenessWindow.load(ordering: .relaxed)
        if seenAlive.withLock({ $0.contains { $0.token == token && now &- $0.at < window } }) { return true }
        guard owners.isAlive(token) else {
            seenAlive.withLock { $0.removeAll { $0.token == token } }
            return false
        }
        seenAlive.withLock { seen in
            if let index = seen.firstIndex(where: { $0.token == token }) {
                seen[index].at = now
            } else if seen.count < Self.seenAliveLimit {
                seen.append((token, now))
            } else if let oldest = seen.indices.min(by: { seen[$0].at < seen[$1].at }) {
                seen[oldest] = (token, now)
            }
        }
        return true
    }

    // MARK: The waiter's side

    /// Takes a record (one this process holds idle, a free one, or one whose owner died) and
    /// sets it waiting with a new generation.
    /// - Throws: `suspended`; `capacityExceeded` when every record is in use.
    func begin() throws -> Waiter {
        let token = try currentToken()
        while let index = idle.withLock({ $0.popLast() }) {
            guard baton_load64(ownerWord(index)) == token else { continue } // lost while suspended
            let old = baton_load64(claimWord(index))
            let generation = (Self.generation(old) &+ 1) & 0x3FFF_FFFF
            if cas(claimWord(index), old, Self.claim(.waiting, generation)) {
                return Waiter(index: index, generation: generation)
            }
        }
        let start = FastRandom.int(in: 1..<Self.recordCount)
        for step in 0..<(Self.recordCount - 1) {
            let index = 1 + (start - 1 + step) % (Self.recordCount - 1)
            let owner = baton_load64(ownerWord(index))
            if owner != 0 && isAlive(owner) { continue }
            // The owner word is the record's lock: whoever swaps it in owns the record.
            guard cas(ownerWord(index), owner, token) else { continue }
            let old = baton_load64(claimWord(index))
            let generation = (Self.generation(old) &+ 1) & 0x3FFF_FFFF
            baton_store64(claimWord(index), Self.claim(.waiting, generation))
            return Waiter(index: index, generation: generation)
        }
        throw BatonError(.capacityExceeded, "all \(Self.recordCount - 1) rendezvous waiter records of the container are in use by live processes")
    }

    /// Closes the wait: "waiting" becomes "cancelled", so nothing can complete it any more.
    /// Returns the case that a counterpart claimed first, or `nil` when none did.
    func finish(_ waiter: Waiter) -> Int? {
        let waiting = Self.claim(.waiting, waiter.generation)
        if cas(claimWord(waiter.index), waiting, Self.claim(.cancelled, waiter.generation)) { return nil }
        let claim = baton_load64(claimWord(waiter.index))
        guard Self.state(claim) == .claimed, Self.generation(claim) == waiter.generation else { return nil }
        return Int(UInt32(truncatingIfNeeded: claim))
    }

    /// Cancels the waiter before it completes a case on its own (a take or a send found while
    /// registered). `false` when a counterpart claimed it first.
    func cancelForOwnMove(_ waiter: Waiter) -> Bool {
        let waiting = Self.claim(.waiting, waiter.generation)
        if cas(claimWord(waiter.index), waiting, Self.claim(.cancelled, waiter.generation)) { return true }
        // Cancelled already (an earlier own move): still free to move.
        return baton_load64(claimWord(waiter.index)) == Self.claim(.cancelled, waiter.generation)
    }

    /// Whether the waiter is still waiting (nothing claimed or cancelled it).
    func isWaiting(_ waiter: Waiter) -> Bool {
        baton_load64(claimWord(waiter.index)) == Self.claim(.waiting, waiter.generation)
    }

    /// Gives the record back to this process's idle list (after ``finish(_:)``).
    func end(_ waiter: Waiter) {
        idle.withLock { $0.append(waiter.index) }
    }

    // MARK: The counterpart's side

    enum Standing {
        /// Waiting, and its owner lives: it may be claimed.
        case waiting
        /// Claimed for exactly `case`.
        case claimed(Int)
        /// Claimed otherwise, or cancelled, by a live owner: leave it alone.
        case busy
        /// Its owner died or the record was taken over since: what refers to it is stale.
        case gone
    }

    /// How the waiter `reference` (from a frame or a channel header) stands now.
    ///
    /// With `freshly`, the owner's liveness is checked now, not taken from the last
    /// ``defaultLivenessWindow``: for a receiver deciding whether an element handed to another
    /// waiter is an orphan (nothing would ring it again when the window ends).
    func standing(_ reference: UInt64, freshly: Bool = false) -> Standing {
        let waiter = Waiter(reference: reference)
        guard waiter.index > 0, waiter.index < Self.recordCount else { return .gone }
        let claim = baton_load64(claimWord(waiter.index))
        guard Self.generation(claim) == waiter.generation, Self.state(claim) != .free else { return .gone }
        let owner = baton_load64(ownerWord(waiter.index))
        guard freshly ? isAlive(owner) : isRecentlyAlive(owner) else { return .gone }
        switch Self.state(claim) {
        case .waiting: return .waiting
        case .claimed: return .claimed(Int(UInt32(truncatingIfNeeded: claim)))
        default: return .busy
        }
    }

    /// Claims the waiter `reference` for its case `index`. `false` when it is no longer waiting.
    func claim(_ reference: UInt64, case index: Int) -> Bool {
        let waiter = Waiter(reference: reference)
        guard waiter.index > 0, waiter.index < Self.recordCount else { return false }
        return cas(claimWord(waiter.index), Self.claim(.waiting, waiter.generation),
                           Self.claim(.claimed, waiter.generation, case: UInt32(truncatingIfNeeded: index)))
    }
}
