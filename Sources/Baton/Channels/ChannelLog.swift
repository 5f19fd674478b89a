import CBatonShims
import Synchronization

/// The storage of one channel: a header with a lock (``SharedMutex``) and doorbells, and a log of
/// ``ChannelFrame``s that consumers take and then acknowledge.
///
/// A cross-process channel lives in `.baton/channels/<name>`; an in-process channel uses the same
/// layout in private memory. File layout (little-endian):
/// ```
/// header (4096 bytes, mapped on its own so the mutex never moves)
///   0 magic "BATNCHN1"   8 version   12 capacity kind   16 capacity count   24 CRC-32C of 0..<24
///   64  the lock (``SharedMutex``, 16 bytes; held for microseconds)
///   96  processor of the readable doorbell's last ring   100 of the writable's (hints, see
///       ``ChannelDoorbell/spin(after:)``; 0 unknown)
///   104 rings owed by the last holder (bit 0 readable, bit 1 writable)   112 its owner token
///       (0: none owed; see `withLock`)   120 processor of the readable doorbell's last sleeper
///   124 of the writable's (hints, see ``ChannelExecutor/deferRings(of:bits:token:)``; 0 unknown)
///   128 readable doorbell (wait word)   132 its sleepers
///   136 writable doorbell (wait word)   140 its sleepers
///   144 closed   152 head   160 tail   168 data size   176 ready count   184 taken count
///   200 next take id   208 (unused: was waiting receivers)   216 layout epoch
///   224 skipped malformed regions
///   240 rendezvous receivers waiting (49 x 16 bytes: u64 waiter reference, u32 case, u32 0),
///       see ``ChannelWaiterTable``
///   1024 receivers (376 x u64): the owner token (``OwnerTokens``) of each receiving process
///   4032 the seal: a copy of head, tail, data size, ready, taken, next take id and layout
///        epoch (7 x u64), then at 4088 the CRC-32C of that copy (u32); see ``sealedFields``
/// data (from byte 4096): frames between head and tail; consumed frames before head are
///   reclaimed by moving the live frames to the start (only when they do not overlap), or the
///   file grows.
/// ```
/// A taker records its owner token in a receiver slot, and the slot's index in each frame it
/// takes; a frame it took but did not acknowledge goes back to the channel once its token is
/// released (the process died or suspended).
///
/// The words that steer reading (head, tail, the counts) change in place under the lock, so no
/// checksum can cover them where they are. Instead every holder, before it unlocks, copies them
/// to the seal with a CRC; the next holder compares. A word that another program changed is put
/// back from the copy (and said); a seal that fails its CRC is rebuilt from the words after the
/// structure checks. A holder that died before sealing is told so by the lock, and the repair
/// for a dead holder runs instead. A frame's state word, also changed in place, is checked
/// against the sealed counts: a ready frame that another program marked done or taken is
/// reported when the count disagrees.
final class ChannelLog: @unchecked Sendable {
    // @unchecked: `data`, `mappedDataSize`, `slot` and `pendingRings` are read and written only while holding the
    // lock in the header (see `withLock`); header fields are touched with atomics (most under the
    // same lock); the doorbells and `local` are Sendable.

    static let magic: UInt64 = 0x314E_4843_4E54_4142 // "BATNCHN1" little-endian
    /// 2: the lock is a ``SharedMutex`` and receivers are owner tokens (version 1 held a
    /// pthread mutex and OFD locks). 3: the seal of the header's positions and counts.
    static let version: UInt32 = 3
    static let headerSize = 4096
    static let initialDataSize = 64 * 1024
    static let participantOffset = 1024
    static let oSeal = 4032, oSealChecksum = 4088
    static let maxParticipants = (oSeal - participantOffset) / 8
    static let directoryName = "channels"
    /// How long an operation waits for a live process that holds the channel's lock.
    static let lockPatience: Duration = .seconds(5)

    static let oMagic = 0, oVersion = 8, oKind = 12, oCount = 16, oCRC = 24, oMutex = 64
    static let oReadable = 128, oReadableSleepers = 132, oWritable = 136, oWritableSleepers = 140
    static let oReadableRinger = 96, oWritableRinger = 100
    static let oReadableSleeper = 120, oWritableSleeper = 124
    /// Rings owed by a holder that unlocked: the doorbells (bit 0 readable, bit 1 writable) and
    /// the holder's owner token (0: none owed).
    static let oOwedRings = 104, oOwedRingsOwner = 112
    static let oClosed = 144, oHead = 152, oTail = 160, oDataSize = 168, oReady = 176, oTaken = 184
    static let oNextTake = 200, oWaitingReceivers = 208, oEpoch = 216, oMalformed = 224
    static let oRegistrations = 240, registrationSize = 16
    static let registrationCount = (participantOffset - oRegistrations) / registrationSize
    /// The header words the seal copies: every one changes only under the lock.
    static let sealedFields = [oHead, oTail, oDataSize, oReady, oTaken, oNextTake, oEpoch]

    /// A file's `fd` is the number of ``descriptor``, borrowed for system calls while the log
    /// lives; never close it.
    enum Storage { case file(fd: Int32, relativePath: String, absolutePath: String), memory }

    let storage: Storage
    /// The channel file's descriptor (`nil` in process), closed once, when the log goes.
    private let descriptor: FileDescriptor?
    let capacity: ChannelCapacity
    let name: String
    let readable: ChannelDoorbell
    let writable: ChannelDoorbell
    /// The claim words of rendezvous waiters (shared by every channel of the container object).
    let waiters: ChannelWaiterTable
    private let header: UnsafeMutableRawPointer
    private let headerMemory: ChannelHeaderMemory
    private var data: UnsafeMutableRawPointer
    private var mappedDataSize: Int
    private var slot: Int?
    /// Doorbells to ring once the lock is released (set under the lock; see `withLock`).
    private var pendingRings: (readable: Bool, writable: Bool) = (false, false)
    /// Damage found while opening, said by the first operation (under the lock).
    private var unreportedDamage: String?
    /// The mapping guard's slots for the header and data mappings (-1: not guarded), written
    /// under the lock; the repairs counted in data slots given up on a remap; and the total of
    /// the repairs when last looked at (see ``wasCutShort()``).
    private var headerGuard: Int32 = -1
    private var dataGuard: Int32 = -1
    private var earlierDataRepairs: UInt64 = 0
    private let guardRepairsSeen = Atomic<UInt64>(0)
    private let container: SharedContainer?
    private let local = Mutex<(events: FileEvents.Subscription?, suspension: SuspensionController.RegistrationToken?)>((nil, nil))
    /// Owner tokens of the container (nil for an in-process channel, whose lock owner is always
    /// this process: token ``inProcessToken``).
    private let owners: OwnerTokens?
    private static let inProcessToken: UInt64 = 1

    // MARK: Opening

    /// An in-process channel.
    init(memoryCapacity capacity: ChannelCapacity) {
        self.capacity = capacity.normalized
        self.name = "(in-process)"
        self.storage = .memory
        self.descriptor = nil
        self.container = nil
        headerMemory = ChannelHeaderMemory(allocating: Self.headerSize)
        header = headerMemory.pointer
        data = UnsafeMutableRawPointer.allocate(byteCount: Self.initialDataSize, alignment: 64)
        mappedDataSize = Self.initialDataSize
        slot = 0
        owners = nil
        waiters = .inProcess
        SharedMutex(header.advanced(by: Self.oMutex)).initialize()
        (readable, writable) = Self.doorbells(headerMemory)
        baton_store64(Self.dword(header, Self.oDataSize), UInt64(Self.initialDataSize))
    }

    /// Opens (creating when missing) `.baton/channels/<name>`.
    init(container: SharedContainer, name: String, capacity requested: ChannelCapacity?) throws {
        try SharedContainer.validateName(name, what: "a channel name")
        try container.makeDirectory(Self.directoryName)
        let waiters = try container.channelWaiters
        let relativePath = Self.directoryName + "/" + name
        // Owned by `descriptor` once the channel is open (closed when the log goes); until then a
        // throw closes it.
        let file = try container.openDescriptor(relativePath, flags: O_RDWR | O_CREAT)
        let fd = file.rawValue
        var headerMemory: ChannelHeaderMemory?
        do {
            try Sys.flock(fd, LOCK_EX).get("locking the channel file \(relativePath) to open it")
            defer { _ = Sys.flock(fd, LOCK_UN) }
            let size = Int(try Sys.fstat(fd).get("checking \(relativePath)").st_size)
            if size > 0, size < Self.headerSize {
                // Baton sizes the file in one step under this lock: a shorter file was cut by
                // another program, and whatever it held is gone. Said, not silently reset.
                throw BatonError(.corrupt, "the channel file \(container.absolutePath(relativePath)) was cut short (\(size) bytes); its elements are lost. Remove it and open the channel again")
            }
            if size < Self.headerSize {
                try Sys.ftruncate(fd, 0).get("resetting \(relativePath)")
                try FileSpace.reserve(fd, from: 0, to: Self.headerSize + Self.initialDataSize, path: relativePath)
            }
            let mapped = try Sys.mmap(fd, size: Self.headerSize, writable: true).get("mapping \(relativePath)")
            headerMemory = ChannelHeaderMemory(mapped: mapped, size: Self.headerSize)
            if size < Self.headerSize || baton_load64(Self.dword(mapped, Self.oMagic)) == 0 {
                let stored = (requested ?? .unbounded).normalized.stored
                mapped.storeBytes(of: Self.version.littleEndian, toByteOffset: Self.oVersion, as: UInt32.self)
                mapped.storeBytes(of: stored.kind.littleEndian, toByteOffset: Self.oKind, as: UInt32.self)
                mapped.storeBytes(of: stored.count.littleEndian, toByteOffset: Self.oCount, as: UInt64.self)
                SharedMutex(mapped.advanced(by: Self.oMutex)).initialize()
                baton_store64(Self.dword(mapped, Self.oDataSize), UInt64(Self.initialDataSize))
                Self.seal(mapped)
                mapped.storeBytes(of: Self.magic.littleEndian, toByteOffset: Self.oMagic, as: UInt64.self)
                mapped.storeBytes(of: Self.headerChecksum(mapped).littleEndian, toByteOffset: Self.oCRC, as: UInt32.self)
            }
            guard UInt64(littleEndian: mapped.load(fromByteOffset: Self.oMagic, as: UInt64.self)) == Self.magic,
                  UInt32(littleEndian: mapped.load(fromByteOffset: Self.oCRC, as: UInt32.self)) == Self.headerChecksum(mapped) else {
                throw BatonError(.corrupt, "the channel file \(container.absolutePath(relativePath)) is not a Baton channel or its header failed its checksum; remove it (its elements are lost) and open the channel again")
            }
            guard UInt32(littleEndian: mapped.load(fromByteOffset: Self.oVersion, as: UInt32.self)) == Self.version else {
                throw BatonError(.corrupt, "the channel file \(container.absolutePath(relativePath)) has format version \(mapped.load(fromByteOffset: Self.oVersion, as: UInt32.self)); this Baton reads version \(Self.version)")
            }
            let kind = UInt32(littleEndian: mapped.load(fromByteOffset: Self.oKind, as: UInt32.self))
            let count = UInt64(littleEndian: mapped.load(fromByteOffset: Self.oCount, as: UInt64.self))
            guard let existing = ChannelCapacity(storedKind: kind, count: count) else {
                throw BatonError(.corrupt, "the channel file \(container.absolutePath(relativePath)) names an unknown capacity; remove it")
            }
            if let requested, requested.normalized != existing {
                throw BatonError(.invalidArgument, "the channel \(name) exists with capacity \(existing), not \(requested.normalized); open it with the same capacity")
            }
            self.capacity = existing
        }
        let header = headerMemory!.pointer
        self.headerMemory = headerMemory!
        self.header = header
        self.name = name
        self.container = container
        self.owners = container.owners
        self.waiters = waiters
        self.storage = .file(fd: fd, relativePath: relativePath, absolutePath: container.absolutePath(relativePath))
        self.descriptor = consume file
        self.data = header // replaced below, under the mutex
        self.mappedDataSize = 0
        self.headerGuard = MappingGuard.register(header, size: Self.headerSize, fd: fd)
        (readable, writable) = Self.doorbells(headerMemory!)
        // Every stored property is set: if this throws, deinit runs and closes the descriptor
        // (closing it here too would close it twice).
        try withLock(opening: true) {}
        let token = container.suspension.register(SuspensionRelease(self))
        local.withLock { $0.suspension = token }
    }

    /// The capacity of an existing channel, `nil` when it does not exist.
    static func storedCapacity(container: SharedContainer, name: String) throws -> ChannelCapacity? {
        try SharedContainer.validateName(name, what: "a channel name")
        let relativePath = directoryName + "/" + name
        // Through openFile: a FIFO or directory in its place is refused at once, not waited on.
        guard let file = try container.openDescriptorIfPresent(relativePath, flags: O_RDONLY) else { return nil }
        var bytes = [UInt8](repeating: 0, count: 32)
        let count = try bytes.withUnsafeMutableBytes { try Sys.preadAll(file.rawValue, $0, at: 0).get("reading \(relativePath)") }
        guard count == 32 else { return nil }
        return bytes.withUnsafeBytes { raw -> ChannelCapacity? in
            guard UInt64(littleEndian: raw.load(fromByteOffset: oMagic, as: UInt64.self)) == magic else { return nil }
            return ChannelCapacity(storedKind: UInt32(littleEndian: raw.load(fromByteOffset: oKind, as: UInt32.self)),
                                   count: UInt64(littleEndian: raw.load(fromByteOffset: oCount, as: UInt64.self)))
        }
    }

    deinit {
        readable.shutdown()
        writable.shutdown()
        if let token = local.withLock({ $0.suspension }) { container?.suspension.unregister(token) }
        switch storage {
        case .memory:
            data.deallocate()
        case .file:
            MappingGuard.unregister(headerGuard)
            MappingGuard.unregister(dataGuard)
            if mappedDataSize > 0 { Sys.munmap(data, size: mappedDataSize) }
            // `descriptor` closes itself after this.
        }
    }

    static func headerChecksum(_ base: UnsafeMutableRawPointer) -> UInt32 {
        Checksum.crc32c(UnsafeRawBufferPointer(start: base, count: 24))
    }

    /// Copies the ``sealedFields`` to the seal and checksums the copy (under the lock, before
    /// it is released).
    private static func seal(_ header: UnsafeMutableRawPointer) {
        for (index, offset) in sealedFields.enumerated() {
            baton_store64(dword(header, oSeal + index * 8), baton_load64(dword(header, offset)))
        }
        baton_store32(word(header, oSealChecksum), sealChecksum(header))
    }

    private static func sealChecksum(_ header: UnsafeMutableRawPointer) -> UInt32 {
        Checksum.crc32c(UnsafeRawBufferPointer(start: header.advanced(by: oSeal), count: sealedFields.count * 8))
    }

    /// Compares the header's positions and counts with the seal the last holder left (under the
    /// lock, when that holder did not die inside it). Words that differ from an intact seal were
    /// changed by another program: they are put back. A seal that fails its checksum is left to
    /// be rebuilt from the words, which the structure checks then judge: returns what to say then.
    private func checkSeal() -> String? {
        let intact = baton_load32(Self.word(header, Self.oSealChecksum)) == Self.sealChecksum(header)
        var changed: [String] = []
        for (index, offset) in Self.sealedFields.enumerated() {
            let sealed = baton_load64(Self.dword(header, Self.oSeal + index * 8))
            let current = baton_load64(Self.dword(header, offset))
            guard sealed != current else { continue }
            changed.append("\(Self.fieldName(offset)) \(current) (sealed \(sealed))")
            if intact { baton_store64(Self.dword(header, offset), sealed) }
        }
        guard !intact || !changed.isEmpty else { return nil }
        addField(Self.oMalformed, 1)
        ringOnUnlock(readable: true, writable: true)
        if intact {
            container?.diagnostics.report(.channelRepaired, level: .warning, "repaired channel \(name): another program changed its header words (\(changed.joined(separator: ", "))); they were put back from the seal, nothing was lost")
            return nil
        }
        let message = "the seal of the channel \(name)'s header words failed its checksum (another program changed the file); the channel goes on from the words as they are\(changed.isEmpty ? "" : " (\(changed.joined(separator: ", ")))"), and elements sent before may be lost. Retry the operation"
        container?.diagnostics.report(.channelRepaired, level: .warning, "repaired channel \(name): \(message)")
        return message
    }

    private static func fieldName(_ offset: Int) -> String {
        switch offset {
        case oHead: "head"
        case oTail: "tail"
        case oDataSize: "data size"
        case oReady: "ready count"
        case oTaken: "taken count"
        case oNextTake: "next take id"
        case oEpoch: "layout epoch"
        default: "word \(offset)"
        }
    }

    // MARK: Header access

    private static func word(_ base: UnsafeMutableRawPointer, _ offset: Int) -> UnsafeMutablePointer<UInt32> {
        base.advanced(by: offset).assumingMemoryBound(to: UInt32.self)
    }
    private static func dword(_ base: UnsafeMutableRawPointer, _ offset: Int) -> UnsafeMutablePointer<UInt64> {
        base.advanced(by: offset).assumingMemoryBound(to: UInt64.self)
    }
    private func field(_ offset: Int) -> Int { Int(truncatingIfNeeded: baton_load64(Self.dword(header, offset))) }
    private func setField(_ offset: Int, _ value: Int) { baton_store64(Self.dword(header, offset), UInt64(truncatingIfNeeded: value)) }
    private func addField(_ offset: Int, _ delta: Int) { setField(offset, field(offset) &+ delta) }

    /// Whether ``close()`` was called (by any process).
    var isClosed: Bool { baton_load32(Self.word(header, Self.oClosed)) != 0 }

    // MARK: The lock

    /// Runs `body` holding the channel's lock. When the previous holder died inside, the log is
    /// repaired first, and both doorbells ring.
    ///
    /// Doorbells that `body` asks for (``ringOnUnlock(readable:writable:)``) ring just *after*
    /// the lock is released, so that the waiter they wake never finds the lock still held (on
    /// one processor it would run, find the lock taken, and sleep again: two more context
    /// switches per hand-off). The rings are first recorded in the header as owed, with the
    /// holder's owner token, and the record is cleared after them: a process killed between its
    /// unlock and its rings leaves the record, and the next holder makes the rings. (A process
    /// killed before its unlock is a dead holder: the next holder's repair rings both.) Either
    /// way a waiter left asleep by a death is woken by the next operation on the channel, as
    /// before.
    /// - Throws: `suspended` while the container is suspended; what `body` throws.
    private func withLock<R>(opening: Bool = false, _ body: () throws -> R) throws -> R {
        if try wasCutShort() { throw cutShortError() }
        let mutex = SharedMutex(header.advanced(by: Self.oMutex))
        let token = try owners?.enter() ?? Self.inProcessToken
        defer { owners?.leave() }
        // Held for microseconds by a running process; a holder that is stopped (SIGSTOP, a
        // debugger) but alive is waited for at most `lockPatience`, never for ever.
        guard let acquired = mutex.lock(as: token, tokens: owners, patience: Self.lockPatience, keepAlive: headerMemory) else {
            throw BatonError(.busy, "another process held the lock of the channel \(name) for more than \(Self.lockPatience); it may be stopped (SIGSTOP) inside an operation. Retry later.")
        }
        // Rings another holder owed when it unlocked and may not have made (it died, or it is
        // between its unlock and its ring): this holder makes them too.
        let owed = baton_load64(Self.dword(header, Self.oOwedRingsOwner)) != 0 ? baton_load32(Self.word(header, Self.oOwedRings)) : 0
        defer {
            let owedBits = owed | (pendingRings.readable ? 1 : 0) | (pendingRings.writable ? 2 : 0)
            pendingRings = (false, false)
            if owedBits != 0 {
                baton_store32(Self.word(header, Self.oOwedRings), owedBits)
                baton_store64(Self.dword(header, Self.oOwedRingsOwner), token)
            }
            if storage.isFile { Self.seal(header) }
            mutex.unlock(as: token)
            // On the channel executor's thread the rings wait until its task next waits or
            // suspends (see ``ChannelExecutor/deferRings(of:bits:token:)``); anywhere else they
            // are made now.
            if owedBits != 0, !ChannelExecutor.deferRings(of: self, bits: owedBits, token: token) {
                makeOwedRings(owedBits, token: token)
            }
        }
        if acquired == .ownerDied {
            try? followDataSize()
            repair()
            container?.diagnostics.report(.channelRepaired, "repaired channel \(name) after a process died holding its lock")
            ringOnUnlock(readable: true, writable: true)
        } else if storage.isFile, let damage = checkSeal() {
            // Rebuilt from words that nothing vouches for: said to this caller, whose operation
            // does not run (the rebuilt seal is kept; a retry proceeds). Found while opening, it
            // is said by the first operation instead.
            try followDataSize()
            if !structureIsSound() { repair() }
            unreportedDamage = damage
        }
        if let damage = unreportedDamage, !opening {
            unreportedDamage = nil
            throw BatonError(.corrupt, damage)
        }
        try followDataSize()
        if !structureIsSound() {
            repair()
            container?.diagnostics.report(.channelRepaired, level: .warning, "repaired channel \(name): its header words failed their checks (positions outside the file); recounted from the frames")
            addField(Self.oMalformed, 1)
            ringOnUnlock(readable: true, writable: true)
        }
        let result = try body()
        // A fault that the mapping guard repaired while `body` ran: it read zeros where the
        // elements were.
        if try wasCutShort() { throw cutShortError() }
        return result
    }

    /// Whether another program cut the file short since the last look; if so it is extended
    /// again (zeros) before the mapping is touched further.
    ///
    /// With both mappings guarded (``MappingGuard``), a touch past the end of the file was
    /// repaired in the fault handler, which counted it: two loads and no system call. Unguarded
    /// (the guard's table was full), one `fstat`.
    private func wasCutShort() throws -> Bool {
        guard case .file(let fd, let relativePath, _) = storage else { return false }
        let size = Self.headerSize + max(mappedDataSize, 1)
        guard headerGuard >= 0, dataGuard >= 0 || mappedDataSize == 0 else {
            return try MappedFile.restoreTruncatedSize(fd, to: size, path: relativePath)
        }
        let repairs = MappingGuard.repairs(in: headerGuard) &+ MappingGuard.repairs(in: dataGuard) &+ earlierDataRepairs
        let seen = guardRepairsSeen.load(ordering: .acquiring)
        guard repairs != seen else { return false }
        guard guardRepairsSeen.compareExchange(expected: seen, desired: repairs, ordering: .acquiringAndReleasing).exchanged else {
            return false // another thread of this process saw it first, and says it
        }
        // The guard extended the file when it repaired; extend it again if it was cut since.
        try MappedFile.restoreTruncatedSize(fd, to: size, path: relativePath)
        return true
    }

    private func cutShortError() -> BatonError {
        guard case .file(_, _, let absolutePath) = storage else { return BatonError(.corrupt, "the channel was cut short") }
        return BatonError(.corrupt, "the channel file \(absolutePath) was cut short by another program; the elements it held may be lost. Remove it and open the channel again")
    }

    /// The two doorbells of the header in `memory`, at their words in the layout above.
    private static func doorbells(_ memory: ChannelHeaderMemory) -> (readable: ChannelDoorbell, writable: ChannelDoorbell) {
        (ChannelDoorbell(memory, word: oReadable, sleepers: oReadableSleepers, ringer: oReadableRinger, sleeper: oReadableSleeper, threadName: "baton-chan-rd"),
         ChannelDoorbell(memory, word: oWritable, sleepers: oWritableSleepers, ringer: oWritableRinger, sleeper: oWritableSleeper, threadName: "baton-chan-wr"))
    }

    /// Rings the doorbells of `bits` (1 readable, 2 writable) that the holder with `token` owed at
    /// its unlock, then clears the record of the debt unless a later holder took it over (and
    /// rings too). Called right after the unlock, or by ``ChannelExecutor`` when it makes the
    /// rings it deferred.
    func makeOwedRings(_ bits: UInt32, token: UInt64) {
        if Self.killBeforeRing.load(ordering: .relaxed) { _ = kill(baton_process_id(), SIGKILL) }
        if bits & 1 != 0 { readable.ring() }
        if bits & 2 != 0 { writable.ring() }
        _ = baton_cas64(Self.dword(header, Self.oOwedRingsOwner), token, 0)
    }

    /// Asks for doorbells to ring once the lock is released (call under the lock; see `withLock`).
    private func ringOnUnlock(readable: Bool = false, writable: Bool = false) {
        if readable { pendingRings.readable = true }
        if writable { pendingRings.writable = true }
    }

    /// Maps the data region again when another process grew it.
    ///
    /// The header's words are outside its checksum, so the recorded size is checked against the
    /// file: a writer grows the file before it records the new size and never shrinks it, so a
    /// size that is not a multiple of the initial size, is smaller than the mapping, or is
    /// larger than the file was forged or damaged; the file's own length is used instead (and
    /// the repair counted as a malformed region).
    private func followDataSize() throws {
        var size = field(Self.oDataSize)
        guard size != mappedDataSize || mappedDataSize == 0, case .file(let fd, let relativePath, _) = storage else { return }
        let fileSize = Int(try Sys.fstat(fd).get("checking \(relativePath)").st_size)
        let onFile = max(0, fileSize - Self.headerSize) / Self.initialDataSize * Self.initialDataSize
        if size <= 0 || size % Self.initialDataSize != 0 || size < mappedDataSize || size > onFile {
            size = max(onFile, mappedDataSize, Self.initialDataSize)
            setField(Self.oDataSize, size)
            addField(Self.oMalformed, 1)
        }
        if fileSize < Self.headerSize + size {
            // Cut short by someone else: extend it again (the lost part reads as zeros).
            try FileSpace.reserve(fd, from: fileSize, to: Self.headerSize + size, path: relativePath)
        }
        let mapped = try mapData(fd, size: size, relativePath: relativePath)
        earlierDataRepairs &+= MappingGuard.repairs(in: dataGuard)
        MappingGuard.unregister(dataGuard)
        if mappedDataSize > 0 { Sys.munmap(data, size: mappedDataSize) }
        dataGuard = MappingGuard.register(mapped, size: size, fd: fd, offset: Self.headerSize)
        data = mapped
        mappedDataSize = size
    }

    private func mapData(_ fd: Int32, size: Int, relativePath: String) throws -> UnsafeMutableRawPointer {
        guard let pointer = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(Self.headerSize)), pointer != MAP_FAILED else {
            throw BatonError.system(SystemCallError(call: "mmap", errno: errno), "mapping the data of \(relativePath)")
        }
        return pointer
    }

    /// Makes room for `size` more bytes at the tail: moves the live frames to the start when they
    /// do not overlap their destination (so a crash mid-copy leaves the old frames intact), or
    /// grows the data region.
    private func ensureSpace(_ size: Int) throws {
        var head = field(Self.oHead), tail = field(Self.oTail)
        if tail + size <= mappedDataSize { return }
        let live = tail - head
        if head > 0, live < head, live + size <= mappedDataSize {
            if live > 0 { data.copyMemory(from: data.advanced(by: head), byteCount: live) }
            // tail first: a crash in between leaves head > tail, which `repair` reads as "moved".
            setField(Self.oTail, live)
            setField(Self.oHead, 0)
            addField(Self.oEpoch, 1)
            head = 0; tail = live
            return
        }
        let needed = tail + size
        var newSize = max(mappedDataSize * 2, Self.initialDataSize)
        while newSize < needed { newSize *= 2 }
        switch storage {
        case .memory:
            let grown = UnsafeMutableRawPointer.allocate(byteCount: newSize, alignment: 64)
            grown.copyMemory(from: data, byteCount: tail)
            data.deallocate()
            data = grown
            mappedDataSize = newSize
            setField(Self.oDataSize, newSize)
        case .file(let fd, let relativePath, _):
            let current = Int(try Sys.fstat(fd).get("checking \(relativePath)").st_size)
            try FileSpace.reserve(fd, from: current, to: Self.headerSize + newSize, path: relativePath)
            setField(Self.oDataSize, newSize)
            try followDataSize()
        }
    }

    // MARK: Walking frames

    private func frame(_ offset: Int) -> UnsafeMutableRawPointer { data.advanced(by: offset) }
    private func state(_ offset: Int) -> UInt32 { baton_load32(Self.word(data, offset)) }
    private func setState(_ offset: Int, _ state: ChannelFrame.State) { baton_store32(Self.word(data, offset), state.rawValue) }

    /// The size of the frame at `offset`, or `nil` when its header is damaged.
    private func extent(_ offset: Int, tail: Int) -> Int? {
        ChannelFrame.extent(frame(offset), available: tail - offset)
    }

    /// The next offset after `offset` where a whole, checksummed frame starts (or `tail`).
    private func resynchronize(after offset: Int, tail: Int) -> Int {
        var candidate = (offset + 8) & ~7
        while candidate < tail {
            if extent(candidate, tail: tail) != nil, ChannelFrame.checksumMatches(frame(candidate)) { return candidate }
            candidate += 8
        }
        return tail
    }

    /// Calls `visit(offset, size)` for each readable frame from head to tail, skipping damaged
    /// bytes; stops when `visit` returns false.
    private func walk(_ visit: (Int, Int) -> Bool) {
        let tail = min(field(Self.oTail), mappedDataSize)
        var offset = field(Self.oHead)
        while offset < tail {
            guard let size = extent(offset, tail: tail) else {
                offset = resynchronize(after: offset, tail: tail)
                continue
            }
            if !visit(offset, size) { return }
            offset += size
        }
    }

    /// Moves head past acknowledged frames (not past damaged bytes: the next take reports them).
    private func advanceHead() {
        let tail = field(Self.oTail)
        var head = field(Self.oHead)
        while head < tail, let size = extent(head, tail: tail), state(head) == ChannelFrame.State.done.rawValue {
            head += size
        }
        if head >= tail {
            setField(Self.oTail, 0)
            setField(Self.oHead, 0)
        } else {
            setField(Self.oHead, head)
        }
    }

    /// Puts back to ready the frames marked taken that carry no take (take id 0, or the mark of
    /// a rendezvous offer or handoff); recounts. `true` when any went back.
    private func returnUntakenFrames() -> Bool {
        var returned = false
        walk { offset, _ in
            let owner = baton_load32(Self.word(data, offset + 4))
            if state(offset) == ChannelFrame.State.taken.rawValue,
               frame(offset).load(fromByteOffset: 8, as: UInt64.self) == 0 || owner & Self.markMask != 0 {
                setState(offset, .ready)
                returned = true
            }
            return true
        }
        if returned { recount() }
        return returned
    }

    /// Recomputes the counts from the frames.
    private func recount() {
        var ready = 0, taken = 0
        walk { offset, _ in
            switch state(offset) {
            case ChannelFrame.State.ready.rawValue: ready += 1
            case ChannelFrame.State.taken.rawValue: taken += 1
            default: break
            }
            return true
        }
        setField(Self.oReady, ready)
        setField(Self.oTaken, taken)
    }

    /// Whether the header's positions and counts (outside its checksum) are possible: frames
    /// start 8-byte aligned between 0 and the mapped size, head before tail, counts within what
    /// fits. Checked on every lock (a few loads); walking frames past a forged position would
    /// fault or trap.
    private func structureIsSound() -> Bool {
        let head = field(Self.oHead), tail = field(Self.oTail)
        let ready = field(Self.oReady), taken = field(Self.oTaken)
        let most = mappedDataSize / ChannelFrame.headerSize
        return head >= 0 && head <= tail && tail <= mappedDataSize && head & 7 == 0 && tail & 7 == 0
            && ready >= 0 && ready <= most && taken >= 0 && taken <= most
            && field(Self.oWaitingReceivers) >= 0 && field(Self.oWaitingReceivers) <= 1 << 32
    }

    /// After a holder died inside the lock, or the header failed ``structureIsSound()``: bring
    /// the positions back within the mapping and recount from the frames.
    private func repair() {
        let size = field(Self.oDataSize)
        if size != mappedDataSize && mappedDataSize > 0 { setField(Self.oDataSize, mappedDataSize) }
        var tail = field(Self.oTail)
        if tail < 0 || tail > mappedDataSize { tail = mappedDataSize }
        setField(Self.oTail, min((tail + 7) & ~7, mappedDataSize & ~7))
        let head = field(Self.oHead)
        if head < 0 || head > field(Self.oTail) || head & 7 != 0 { setField(Self.oHead, 0) }
        let waiting = field(Self.oWaitingReceivers)
        if waiting < 0 || waiting > 1 << 32 { setField(Self.oWaitingReceivers, 0) }
        walk { offset, _ in
            if state(offset) > ChannelFrame.State.done.rawValue { setState(offset, .done) }
            return true
        }
        recount()
    }

    // MARK: Participants

    private func participant(_ slot: Int) -> UnsafeMutablePointer<UInt64> {
        Self.dword(header, Self.participantOffset + slot * 8)
    }

    /// This process's receiver slot, holding its owner token (under the lock). Taking a slot whose
    /// process died first returns the frames it took.
    private func ensureSlot(returnedFrames: inout Bool) throws -> Int {
        if let slot { return slot }
        guard storage.isFile, let owners else { return 0 }
        try container?.suspension.checkActive("receive from the channel \(name)")
        let token = try owners.current()
        for candidate in 0..<Self.maxParticipants {
            let current = baton_load64(participant(candidate))
            guard current == 0 || current == token || !owners.isAlive(current) else { continue }
            baton_store64(participant(candidate), token)
            slot = candidate
            var returned = false
            walk { offset, _ in
                if state(offset) == ChannelFrame.State.taken.rawValue, baton_load32(Self.word(data, offset + 4)) == UInt32(candidate) {
                    setState(offset, .ready)
                    addField(Self.oReady, 1)
                    addField(Self.oTaken, -1)
                    returned = true
                }
                return true
            }
            returnedFrames = returnedFrames || returned
            return candidate
        }
        throw BatonError(.capacityExceeded, "the channel \(name) has \(Self.maxParticipants) live receiving processes; no slot is free")
    }

    /// Gives up the receiver slot (the process is being suspended): its taken frames go back to
    /// the channel for others.
    fileprivate func releaseSlot() {
        guard storage.isFile else { return }
        try? withLock {
            if let slot { baton_store64(participant(slot), 0) }
            slot = nil
        }
    }

    /// Returns to the channel the frames taken by processes that died. `true` when any returned.
    func recoverDeadTakers() throws -> Bool {
        guard storage.isFile, let owners else { return false }
        let returned = try withLock { () -> Bool in
            let mine = slot.map { UInt32($0) }
            var alive: [UInt32: Bool] = [:]
            var returned = false
            walk { offset, _ in
                guard state(offset) == ChannelFrame.State.taken.rawValue else { return true }
                let owner = baton_load32(Self.word(data, offset + 4))
                if owner == mine { return true }
                let isAlive: Bool
                if let known = alive[owner] { isAlive = known } else {
                    isAlive = owner < Self.maxParticipants && owners.isAlive(baton_load64(participant(Int(owner))))
                    alive[owner] = isAlive
                }
                if !isAlive {
                    setState(offset, .ready)
                    addField(Self.oReady, 1)
                    addField(Self.oTaken, -1)
                    returned = true
                }
                return true
            }
            ringOnUnlock(readable: returned)
            return returned
        }
        return returned
    }

    /// Moves when a process of the container released its owner token (it died or suspended):
    /// a receiver waiting for frames that others took watches this.
    func ownerReleases() throws -> EventCounter? {
        guard storage.isFile, let owners else { return nil }
        return try local.withLock { local in
            if let events = local.events { return events.events }
            let subscription = try owners.watchAll()
            local.events = subscription
            return subscription.events
        }
    }

    // MARK: Operations

    enum AppendMode {
        case always
        case ifRoom(Int)
        /// Rendezvous `trySend`: only to a registered receiver that this append claims; the
        /// frame is addressed to it.
        case handoff
        /// A rendezvous offer of `waiter`'s case: any receiver that claims the waiter takes it.
        case offer(ChannelWaiterTable.Waiter, case: Int)
        /// A waiting select's rendezvous send, armed in one critical section: a handoff to a
        /// registered receiver when one can be claimed (`waiter` is cancelled first: the case
        /// fired), else an offer of `waiter`'s case (`own` is `nil` in this mode).
        case handoffOrOffer(ChannelWaiterTable.Waiter, case: Int)
    }

    enum AppendResult {
        case appended
        /// No room, or no waiting receiver.
        case refused
        /// `own` was claimed by a counterpart before this append could cancel it.
        case ownClaimed
        /// ``AppendMode/handoffOrOffer(_:case:)`` found no receiver: the element is offered.
        case offered
    }

    /// Appends a frame for `payload`, written in place in the channel (no intermediate copy).
    ///
    /// `own` is the caller's waiter when it is registered (a select checking its cases again
    /// after it registered): it is cancelled, under the lock, before the frame goes in.
    /// - Throws: `closed` after ``close()``; `invalidArgument` when the payload is too large.
    func append(payload: UnsafeRawBufferPointer, coding: ChannelFrame.Coding, sendID: UInt64, mode: AppendMode,
                own: ChannelWaiterTable.Waiter? = nil) throws -> AppendResult {
        let size = try ChannelFrame.checkedSize(payload: payload.count)
        return try withLock { () -> AppendResult in
            guard !isClosed else {
                throw BatonError(.closed, "the channel \(name) is closed; nothing more can be sent on it")
            }
            var mark: (flags: UInt32, reference: UInt64)?
            var ownCancelled = false
            switch mode {
            case .always: break
            case .ifRoom(let limit):
                if field(Self.oReady) + field(Self.oTaken) >= limit { return .refused }
            case .offer(let waiter, let index):
                mark = (Self.markOffer | UInt32(index), waiter.reference)
            case .handoff, .handoffOrOffer:
                // Room first: once a receiver is claimed, the element must go in.
                try ensureSpace(size)
                let offering: (waiter: ChannelWaiterTable.Waiter, case: Int)?
                if case .handoffOrOffer(let waiter, let index) = mode { offering = (waiter, index) } else { offering = nil }
                if let (entry, reference, index) = claimRegisteredReceiver(own: offering?.waiter ?? own) {
                    if reference == 0 { return .ownClaimed }
                    ownCancelled = true
                    clearRegistration(entry)
                    mark = (Self.markHandoff | UInt32(index), reference)
                } else if let offering {
                    // Still waiting (nothing else of this select claimed it meanwhile, or the
                    // offer would never be taken): offer.
                    guard waiters.isWaiting(offering.waiter) else { return .ownClaimed }
                    mark = (Self.markOffer | UInt32(offering.case), offering.waiter.reference)
                } else {
                    if let own, !waiters.isWaiting(own), !waiters.cancelForOwnMove(own) { return .ownClaimed }
                    return .refused
                }
            }
            if let own, !ownCancelled, !waiters.cancelForOwnMove(own) { return .ownClaimed }
            try ensureSpace(size)
            let tail = field(Self.oTail)
            ChannelFrame.write(into: data.advanced(by: tail), size: size, payload: payload, coding: coding, sendID: sendID)
            if let mark {
                frame(tail).storeBytes(of: mark.flags, toByteOffset: 4, as: UInt32.self)
                frame(tail).storeBytes(of: mark.reference, toByteOffset: 8, as: UInt64.self)
            }
            setField(Self.oTail, tail + size)
            let wasEmpty = field(Self.oReady) <= 0
            addField(Self.oReady, 1)
            // Receivers wait only after finding nothing ready, so only the first frame after
            // that needs to ring; an element for a registered receiver always rings.
            let handoff = mark.map { $0.flags & Self.markMask == Self.markHandoff } ?? false
            ringOnUnlock(readable: wasEmpty || handoff)
            if case .handoffOrOffer = mode, !handoff { return .offered }
            return .appended
        }
    }

    // MARK: Rendezvous waiters

    /// Frame owner word while ready: a waiter reference follows in the take-id word. An offer
    /// (a waiting sender's element) or a handoff (an element for one registered receiver); the
    /// low 30 bits are the waiter's case. (A taker's slot never sets these bits.)
    static let markOffer: UInt32 = 0x8000_0000
    static let markHandoff: UInt32 = 0xC000_0000
    private static let markMask: UInt32 = 0xC000_0000

    private func registration(_ entry: Int) -> UnsafeMutablePointer<UInt64> {
        Self.dword(header, Self.oRegistrations + entry * Self.registrationSize)
    }
    private func registrationCase(_ entry: Int) -> Int {
        Int(baton_load32(Self.word(header, Self.oRegistrations + entry * Self.registrationSize + 8)))
    }
    private func clearRegistration(_ entry: Int) { baton_store64(registration(entry), 0) }

    /// Registers `waiter` as a receiver waiting on this channel for its case `index`, so that a
    /// `trySend` may claim it. `false` when every registration slot holds a live waiter (the
    /// waiter then only takes offered elements).
    func register(_ waiter: ChannelWaiterTable.Waiter, case index: Int) throws -> Bool {
        try withLock { registerLocked(waiter, case: index) }
    }

    /// ``register(_:case:)`` under the lock.
    private func registerLocked(_ waiter: ChannelWaiterTable.Waiter, case index: Int) -> Bool {
        var free: Int?
        for entry in 0..<Self.registrationCount {
            let reference = baton_load64(registration(entry))
            if reference == waiter.reference { return true }
            if reference == 0 || { if case .gone = waiters.standing(reference) { return true }; return false }() {
                clearRegistration(entry)
                if free == nil { free = entry }
            }
        }
        guard let free else { return false }
        baton_store32(Self.word(header, Self.oRegistrations + free * Self.registrationSize + 8), UInt32(truncatingIfNeeded: index))
        baton_store64(registration(free), waiter.reference)
        return true
    }

    /// How many receivers are registered as waiting, whether their processes live or not (for
    /// tests and diagnostics).
    func registeredReceiverCount() throws -> Int {
        try withLock { (0..<Self.registrationCount).filter { baton_load64(registration($0)) != 0 }.count }
    }

    /// Removes the registrations of `waiter`.
    func unregister(_ waiter: ChannelWaiterTable.Waiter) throws {
        try withLock {
            for entry in 0..<Self.registrationCount where baton_load64(registration(entry)) == waiter.reference {
                clearRegistration(entry)
            }
        }
    }

    /// Claims a registered, live, waiting receiver (under the lock), first cancelling `own`
    /// (never claiming it). Returns the entry, the receiver's reference and case; a reference of
    /// 0 when `own` was claimed first; `nil` when no receiver could be claimed.
    private func claimRegisteredReceiver(own: ChannelWaiterTable.Waiter?) -> (Int, UInt64, Int)? {
        let start = FastRandom.int(in: 0..<Self.registrationCount)
        var ownCancelled = false
        for step in 0..<Self.registrationCount {
            let entry = (start + step) % Self.registrationCount
            let reference = baton_load64(registration(entry))
            guard reference != 0 else { continue }
            if let own, ChannelWaiterTable.Waiter(reference: reference).index == own.index { continue }
            switch waiters.standing(reference) {
            case .gone: clearRegistration(entry); continue
            case .busy, .claimed: continue
            case .waiting: break
            }
            if let own, !ownCancelled {
                guard waiters.cancelForOwnMove(own) else { return (entry, 0, 0) }
                ownCancelled = true
            }
            let index = registrationCase(entry)
            if waiters.claim(reference, case: index) { return (entry, reference, index) }
        }
        return nil
    }

    /// A frame this process took and has not acknowledged.
    struct Taken: Sendable {
        let offset: Int
        let epoch: Int
        let takeID: UInt64
        let coding: ChannelFrame.Coding
    }

    enum TakeResult {
        /// Taken (and, when the caller asked for it, already acknowledged); `extract` was called.
        case taken(Taken)
        case malformed(String)
        /// Nothing to take; `othersTaking` when other processes hold taken frames.
        case empty(othersTaking: Bool)
        /// Closed and drained.
        case end
        /// The caller's waiter (`own`) was claimed by a counterpart before it could take.
        case ownClaimed
    }

    /// Takes the oldest ready frame and passes its payload (in the channel's memory, valid only
    /// during the call) to `extract`, under the lock.
    ///
    /// With `acknowledge`, the frame is acknowledged in the same critical section, right after
    /// `extract` returned: for payloads that `extract` turns into the element itself (text and
    /// bytes are copied out, which cannot fail). The element still leaves the channel only once
    /// it is in the receiver's memory, as with a separate ``acknowledge(_:)``: a receiver that
    /// dies inside the critical section leaves the frame ready (the next locker is told the
    /// owner died and repairs the log), for one lock instead of two and no `taken` bookkeeping.
    ///
    /// Rendezvous frames: an offer is taken only by claiming its waiter (a dead or stale
    /// waiter's offer is dropped, its send never completed); a handoff addressed to a live
    /// waiter is left to it (an orphan, whose waiter died, goes to anyone). With `own` (the
    /// caller's registered waiter), `own` is cancelled before anything is taken and its own
    /// offers are skipped; with `addressedTo`, only the handoff addressed to that waiter is taken.
    ///
    /// With `registering` (a waiting select arming its rendezvous receive case), `own` is
    /// registered as a receiver for that case in the same critical section when nothing could be
    /// taken: a sender that comes later finds the registration, one that came earlier left an
    /// offer that this take found.
    func take(acknowledge: Bool = false, own: ChannelWaiterTable.Waiter? = nil, addressedTo: ChannelWaiterTable.Waiter? = nil,
              registering: Int? = nil, _ extract: (UnsafeRawBufferPointer, ChannelFrame.Coding) -> Void) throws -> TakeResult {
        var ringWritable = false
        var ringReadable = false
        let result = try withLock { () -> TakeResult in
            let result = try { () throws -> TakeResult in
                let mySlot = try ensureSlot(returnedFrames: &ringReadable)
                let tail = min(field(Self.oTail), mappedDataSize)
                var offset = field(Self.oHead)
                var othersTaking = false
                while offset < tail {
                    guard let size = extent(offset, tail: tail) else {
                        let next = resynchronize(after: offset, tail: tail)
                        if offset == field(Self.oHead) {
                            setField(Self.oHead, next)
                            advanceHead()
                            recount()
                            addField(Self.oMalformed, 1)
                            ringWritable = true
                            return .malformed("the channel \(name) held \(next - offset) damaged bytes at offset \(offset) (a frame failed its format check); they were skipped and the channel goes on")
                        }
                        offset = next
                        continue
                    }
                    let base = frame(offset)
                    switch state(offset) {
                    case ChannelFrame.State.ready.rawValue:
                        var claimOffer: (reference: UInt64, case: Int)?
                        switch eligibility(base, own: own, addressedTo: addressedTo) {
                        case .take: break
                        case .claim(let reference, let index): claimOffer = (reference, index)
                        case .skip:
                            offset += size
                            continue
                        case .drop:
                            setState(offset, .done)
                            addField(Self.oReady, -1)
                            if offset == field(Self.oHead) { advanceHead() }
                            ringWritable = true
                            offset += size
                            continue
                        }
                        if let own, addressedTo == nil, !waiters.cancelForOwnMove(own) { return .ownClaimed }
                        if let claimOffer, !waiters.claim(claimOffer.reference, case: claimOffer.case) {
                            offset += size
                            continue
                        }
                        guard ChannelFrame.checksumMatches(base), let coding = ChannelFrame.coding(base) else {
                            setState(offset, .done)
                            addField(Self.oReady, -1)
                            addField(Self.oMalformed, 1)
                            advanceHead()
                            ringWritable = true
                            return .malformed("a frame of the channel \(name) failed its CRC-32C check or names an unknown coding; it was skipped and the channel goes on")
                        }
                        let length = ChannelFrame.payloadLength(base)
                        let payload = UnsafeRawBufferPointer(start: base.advanced(by: ChannelFrame.headerSize), count: length)
                        // A rendezvous sender waits for its frame to leave the ready state.
                        ringWritable = capacity == .rendezvous
                        if acknowledge {
                            extract(payload, coding)
                            if case .bounded(let limit) = capacity, field(Self.oReady) + field(Self.oTaken) >= limit { ringWritable = true }
                            setState(offset, .done)
                            addField(Self.oReady, -1)
                            if offset == field(Self.oHead) { advanceHead() }
                            return .taken(Taken(offset: offset, epoch: 0, takeID: 0, coding: coding))
                        }
                        let takeID = UInt64(field(Self.oNextTake) &+ 1)
                        setField(Self.oNextTake, Int(truncatingIfNeeded: takeID))
                        base.storeBytes(of: UInt32(mySlot), toByteOffset: 4, as: UInt32.self)
                        base.storeBytes(of: takeID, toByteOffset: 8, as: UInt64.self)
                        setState(offset, .taken)
                        addField(Self.oReady, -1)
                        addField(Self.oTaken, 1)
                        extract(payload, coding)
                        return .taken(Taken(offset: offset, epoch: field(Self.oEpoch), takeID: takeID, coding: coding))
                    case ChannelFrame.State.taken.rawValue:
                        if storage.isFile, baton_load32(Self.word(data, offset + 4)) != UInt32(mySlot) { othersTaking = true }
                    case ChannelFrame.State.done.rawValue:
                        break
                    default:
                        setState(offset, .done)
                        recount()
                        addField(Self.oMalformed, 1)
                        advanceHead()
                        return .malformed("a frame of the channel \(name) had an unknown state; it was skipped and the channel goes on")
                    }
                    offset += size
                }
                // Nothing ready was found: keep the count honest (appends ring only after it was 0).
                if field(Self.oReady) != 0 || field(Self.oTaken) < 0 {
                    let counted = (ready: field(Self.oReady), taken: field(Self.oTaken))
                    recount()
                    let found = (ready: field(Self.oReady), taken: field(Self.oTaken))
                    if found.taken > counted.taken, returnUntakenFrames() {
                        // A take writes its take id and slot with the state; a frame marked
                        // taken without them was marked by another program.
                        addField(Self.oMalformed, 1)
                        ringReadable = true
                        return .malformed("the channel \(name) held frames marked taken that no receiver took (changed by another program); they were returned to the channel")
                    }
                    if found.ready + found.taken < counted.ready + counted.taken {
                        // Every change of a frame's state changes the counts with it, under the
                        // lock: fewer live frames than counted means another program marked
                        // some done (or damaged them) in place.
                        addField(Self.oMalformed, 1)
                        ringWritable = true
                        return .malformed("the channel \(name) counted \(counted.ready + counted.taken) elements waiting or being received, but its frames hold \(found.ready + found.taken): \(counted.ready + counted.taken - found.ready - found.taken) element(s) were marked done by another program and are lost; the channel goes on")
                    }
                }
                if isClosed && field(Self.oTaken) <= 0 { return .end }
                return .empty(othersTaking: othersTaking)
            }()
            if let registering, let own, case .empty = result, waiters.isWaiting(own) {
                _ = registerLocked(own, case: registering) // all slots live: it takes offers only
            }
            var closedAfterTake = false
            if acknowledge, case .taken = result, isClosed { closedAfterTake = true }
            ringOnUnlock(readable: ringReadable || closedAfterTake, writable: ringWritable)
            return result
        }
        return result
    }

    private enum Eligibility {
        case take
        /// An offer: take it after claiming its waiter for the case.
        case claim(UInt64, Int)
        case skip
        /// An offer of a dead or stale waiter: its send never completed.
        case drop
    }

    /// Whether a ready frame may be taken (see ``take(acknowledge:own:addressedTo:_:)``).
    private func eligibility(_ base: UnsafeMutableRawPointer, own: ChannelWaiterTable.Waiter?, addressedTo: ChannelWaiterTable.Waiter?) -> Eligibility {
        let mark = base.load(fromByteOffset: 4, as: UInt32.self) & Self.markMask
        let reference = base.load(fromByteOffset: 8, as: UInt64.self)
        let index = Int(base.load(fromByteOffset: 4, as: UInt32.self) & ~Self.markMask)
        if let addressedTo {
            return mark == Self.markHandoff && reference == addressedTo.reference ? .take : .skip
        }
        switch mark {
        case Self.markHandoff:
            // Left to its receiver, unless that one died or moved on (an orphan).
            if case .gone = waiters.standing(reference, freshly: true) { return .take }
            return .skip
        case Self.markOffer:
            if let own, ChannelWaiterTable.Waiter(reference: reference).index == own.index { return .skip }
            switch waiters.standing(reference) {
            case .waiting: return .claim(reference, index)
            case .claimed(let claimed) where claimed == index: return .take // its taker died mid-take
            case .claimed, .busy: return .skip
            case .gone: return .drop
            }
        default:
            return .take
        }
    }

    /// Marks the taken frame at `offset` done (under the lock). Returns whether the channel was
    /// full before, for a bounded channel (senders wait only then: ring when it stops being full).
    private func settle(_ offset: Int) -> Bool {
        var wasFull = false
        if case .bounded(let limit) = capacity { wasFull = field(Self.oReady) + field(Self.oTaken) >= limit }
        setState(offset, .done)
        addField(Self.oTaken, -1)
        if offset == field(Self.oHead) { advanceHead() }
        return wasFull
    }

    /// Finds the taken frame of `taken`: at its offset when nothing moved, else by walking.
    private func locate(_ taken: Taken) -> Int? {
        let tail = field(Self.oTail)
        if taken.epoch == field(Self.oEpoch), taken.offset < tail, taken.offset >= field(Self.oHead),
           extent(taken.offset, tail: tail) != nil,
           state(taken.offset) == ChannelFrame.State.taken.rawValue,
           frame(taken.offset).load(fromByteOffset: 8, as: UInt64.self) == taken.takeID {
            return taken.offset
        }
        var found: Int?
        walk { offset, _ in
            if state(offset) == ChannelFrame.State.taken.rawValue, frame(offset).load(fromByteOffset: 8, as: UInt64.self) == taken.takeID {
                found = offset
                return false
            }
            return true
        }
        return found
    }

    /// Acknowledges a taken frame: it leaves the channel for good. `false` when the frame is no
    /// longer this take's (it went back to the channel while this process was suspended).
    func acknowledge(_ taken: Taken) throws -> Bool {
        var wasFull = false
        let acknowledged = try withLock { () -> Bool in
            guard let offset = locate(taken) else { return false }
            wasFull = settle(offset)
            // Senders wait only when the channel is full: ring when it stops being full.
            ringOnUnlock(readable: isClosed, writable: wasFull)
            return true
        }
        if Self.killAfterAcknowledge.load(ordering: .relaxed) { _ = kill(baton_process_id(), SIGKILL) }
        return acknowledged
    }

    /// Puts a taken frame back, for the next receiver.
    func release(_ taken: Taken) throws {
        let released = try withLock { () -> Bool in
            guard let offset = locate(taken) else { return false }
            setState(offset, .ready)
            addField(Self.oTaken, -1)
            addField(Self.oReady, 1)
            ringOnUnlock(readable: true)
            return true
        }
        _ = released
    }

    /// The state of the frame a sender appended with `sendID`: `true` once taken (or gone).
    func isTaken(sendID: UInt64) throws -> Bool {
        try withLock {
            var taken = true
            walk { offset, _ in
                guard ChannelFrame.sendID(frame(offset)) == sendID else { return true }
                taken = state(offset) != ChannelFrame.State.ready.rawValue
                return false
            }
            return taken
        }
    }

    /// Removes the frame appended with `sendID` if nobody took it yet. `true` when removed.
    func withdraw(sendID: UInt64) throws -> Bool {
        let withdrawn = try withLock { () -> Bool in
            var withdrawn = false
            walk { offset, _ in
                guard ChannelFrame.sendID(frame(offset)) == sendID else { return true }
                if state(offset) == ChannelFrame.State.ready.rawValue {
                    setState(offset, .done)
                    addField(Self.oReady, -1)
                    if offset == field(Self.oHead) { advanceHead() }
                    withdrawn = true
                }
                return false
            }
            ringOnUnlock(writable: withdrawn)
            return withdrawn
        }
        return withdrawn
    }

    /// Closes the channel: no more sends; receivers drain what is left.
    func close() throws {
        try withLock {
            baton_store32(Self.word(header, Self.oClosed), 1)
            ringOnUnlock(readable: true, writable: true)
        }
    }

    /// Test support: when set, the process kills itself (SIGKILL) right after an acknowledgement
    /// returned (its lock released and its rings made).
    static let killAfterAcknowledge = Atomic<Bool>(false)
    /// Test support: the process kills itself after its next unlock that owes rings, before it
    /// makes them (see `withLock`).
    static let killBeforeRing = Atomic<Bool>(false)
    /// Test support: rings made on the channel executor's thread wait for the task's next wait or
    /// suspension whatever the processor hints say (``ChannelExecutor/deferRings(of:bits:token:)``).
    let defersRingsAlways = Atomic<Bool>(false)

    /// Test support: takes the channel's lock, calls `locked`, and never returns (the process is
    /// meant to be killed while holding it, to exercise the recovery from a dead owner).
    func holdLockForever(_ locked: () -> Void) throws -> Never {
        try withLock {
            locked()
            while true { _ = sleep(3600) }
        }
    }

    private final class SuspensionRelease: SuspensionParticipant {
        weak let log: ChannelLog?
        init(_ log: ChannelLog) { self.log = log }
        func suspend() async { log?.releaseSlot() }
        func resume() async throws {}
    }
}

extension ChannelLog.Storage {
    var isFile: Bool {
        if case .file = self { return true }
        return false
    }
}
