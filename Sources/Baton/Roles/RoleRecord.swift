import CBatonShims

/// The role's record, kept in `.baton/roles/<name>/record`: the epoch counter, the holder and the
/// pending stop request.
///
/// Layout of a slot (little-endian): magic, version, sequence, last epoch, reserved epoch, boot
/// hash, heartbeat; holder epoch (0: none), priority, pid, state, kind length, since, critical
/// since; stop request (requester's waiter id, 0: none), priority, pid, requested (monotonic and
/// wall), grace, critical bound; holder kind (64 bytes at 144); holder lock id (at 208); waiter
/// count (at 216); the waiters from 256, 32 bytes each (waiter file id, pid, priority, since);
/// CRC-32C of the rest of the slot in its last 4 bytes.
///
/// The waiters are listed here so that a transition finds them without listing the directory:
/// each entry names a `waiter-<pid>-<id>.lock` file that its process keeps locked while it waits,
/// and an entry whose file is not locked (the process died, gave up or suspended itself) is
/// dropped by the next transition. Version 1 records (256-byte slots, no waiter list) are read
/// and rewritten as version 2.
///
/// The file has two slots written alternately, each with a sequence number and a
/// CRC-32C, so a write torn by a crash leaves the previous slot intact. Every change happens
/// under the role's arbiter lock. The epoch counter is made durable in blocks: before an epoch
/// beyond ``reservedEpoch`` is granted, the reservation moves ahead and the file is synced; after
/// a reboot (a different boot id) the counter jumps to the reservation, so an epoch is never
/// reused even if the last writes before a power loss were lost.
struct RoleRecord: Sendable, Equatable {
    struct HolderEntry: Sendable, Equatable {
        var epoch: UInt64
        var priority: Int64
        var pid: Int32
        var state: RoleStatus.State
        var kind: String
        var sinceWallNanoseconds: Int64
        var criticalSinceMonotonic: UInt64
        /// The id of the holder's lock file (`holder-<pid>-<id>.lock`).
        var lockID: UInt64
    }

    struct StopEntry: Sendable, Equatable {
        /// The requester's waiter file id (its liveness).
        var waiterID: UInt64
        var priority: Int64
        var pid: Int32
        var requestedMonotonic: UInt64
        var requestedWallNanoseconds: Int64
        var graceNanoseconds: UInt64
        var maximumCriticalNanoseconds: UInt64

        /// The wall-clock end of the grace (or critical) period, for display.
        func deadlineWallNanoseconds(holderState: RoleStatus.State) -> Int64 {
            requestedWallNanoseconds &+ Int64(clamping: holderState == .critical ? max(maximumCriticalNanoseconds, graceNanoseconds) : graceNanoseconds)
        }

        /// When the requester may overtake a holder in `state`.
        func overtakeAt(holderState: RoleStatus.State) -> UInt64 {
            requestedMonotonic &+ (holderState == .critical ? max(maximumCriticalNanoseconds, graceNanoseconds) : graceNanoseconds)
        }
    }

    var sequence: UInt64 = 0
    var lastEpoch: UInt64 = 0
    var reservedEpoch: UInt64 = 0
    var bootHash: UInt64 = 0
    var heartbeatWallNanoseconds: Int64 = 0
    var holder: HolderEntry?
    var stop: StopEntry?
    /// Processes waiting for the role, in no particular order (see ``RoleDirectory/liveWaiters``).
    var waiters: [WaiterSlot] = []

    /// A process waiting for the role: the id of its waiter file, and what it waits at.
    struct WaiterSlot: Sendable, Equatable {
        var id: UInt64
        var pid: Int32
        var priority: Int64
        var sinceWallNanoseconds: Int64
    }

    static let slotSize = 2560
    static let waiterOffset = 256
    static let waiterSize = 32
    /// How many processes may wait for one role at once.
    static let maximumWaiters = (slotSize - 4 - waiterOffset) / waiterSize
    static let version1SlotSize = 256
    static let fileSize = 2 * slotSize
    static let magic: UInt32 = 0x424C_5231 // "BLR1"
    static let maximumKindBytes = 64
    /// How many epochs one durable reservation covers.
    static let reservationBlock: UInt64 = 1024

    // MARK: Encoding

    /// Encodes the record as a version 2 slot.
    func encode() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.slotSize)
        bytes.withUnsafeMutableBytes { encode(into: $0) }
        return bytes
    }

    /// Encodes the record as a version 2 slot into `bytes` (``slotSize`` bytes).
    func encode(into bytes: UnsafeMutableRawBufferPointer) {
        precondition(bytes.count == Self.slotSize)
        bytes.initializeMemory(as: UInt8.self, repeating: 0)
        func put<T: FixedWidthInteger>(_ value: T, at offset: Int) {
            bytes.storeBytes(of: value.littleEndian, toByteOffset: offset, as: T.self)
        }
        put(Self.magic, at: 0)
        put(UInt32(2), at: 4)
        put(sequence, at: 8)
        put(lastEpoch, at: 16)
        put(reservedEpoch, at: 24)
        put(bootHash, at: 32)
        put(heartbeatWallNanoseconds, at: 40)
        if let holder {
            put(holder.epoch, at: 48)
            put(holder.priority, at: 56)
            put(holder.pid, at: 64)
            bytes[68] = Self.stateCode(holder.state)
            let kind = Array(holder.kind.utf8.prefix(Self.maximumKindBytes))
            bytes[69] = UInt8(kind.count)
            put(holder.sinceWallNanoseconds, at: 72)
            put(holder.criticalSinceMonotonic, at: 80)
            put(holder.lockID, at: 208)
            for (index, byte) in kind.enumerated() { bytes[144 + index] = byte }
        }
        if let stop {
            put(stop.waiterID, at: 88)
            put(stop.priority, at: 96)
            put(stop.pid, at: 104)
            put(stop.requestedMonotonic, at: 112)
            put(stop.requestedWallNanoseconds, at: 120)
            put(stop.graceNanoseconds, at: 128)
            put(stop.maximumCriticalNanoseconds, at: 136)
        }
        let waiters = self.waiters.prefix(Self.maximumWaiters)
        put(UInt32(waiters.count), at: 216)
        for (index, waiter) in waiters.enumerated() {
            let offset = Self.waiterOffset + index * Self.waiterSize
            put(waiter.id, at: offset)
            put(waiter.pid, at: offset + 8)
            put(waiter.priority, at: offset + 16)
            put(waiter.sinceWallNanoseconds, at: offset + 24)
        }
        let crc = Checksum.crc32c(UnsafeRawBufferPointer(rebasing: bytes[0..<(Self.slotSize - 4)]))
        put(crc, at: Self.slotSize - 4)
    }

    /// Decodes one slot (2,560 bytes for version 2, 256 for version 1); `nil` when it is empty,
    /// torn or not a record.
    static func decode(_ bytes: UnsafeRawBufferPointer) -> RoleRecord? {
        let size = bytes.count
        let version: UInt32 = size == slotSize ? 2 : 1
        guard size == slotSize || size == version1SlotSize else { return nil }
        func get<T: FixedWidthInteger>(_ type: T.Type, at offset: Int) -> T {
            T(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: T.self))
        }
        guard get(UInt32.self, at: 0) == magic, get(UInt32.self, at: 4) == version else { return nil }
        let crc = Checksum.crc32c(UnsafeRawBufferPointer(rebasing: bytes[0..<(size - 4)]))
        guard crc == get(UInt32.self, at: size - 4) else { return nil }
        var record = RoleRecord()
        record.sequence = get(UInt64.self, at: 8)
        record.lastEpoch = get(UInt64.self, at: 16)
        record.reservedEpoch = get(UInt64.self, at: 24)
        record.bootHash = get(UInt64.self, at: 32)
        record.heartbeatWallNanoseconds = get(Int64.self, at: 40)
        let holderEpoch = get(UInt64.self, at: 48)
        if holderEpoch != 0 {
            let kindCount = min(Int(bytes[69]), maximumKindBytes)
            record.holder = HolderEntry(
                epoch: holderEpoch,
                priority: get(Int64.self, at: 56),
                pid: get(Int32.self, at: 64),
                state: state(bytes[68]),
                kind: String(decoding: UnsafeRawBufferPointer(rebasing: bytes[144..<(144 + kindCount)]), as: UTF8.self),
                sinceWallNanoseconds: get(Int64.self, at: 72),
                criticalSinceMonotonic: get(UInt64.self, at: 80),
                lockID: get(UInt64.self, at: 208))
        }
        let waiterID = get(UInt64.self, at: 88)
        if waiterID != 0 {
            record.stop = StopEntry(
                waiterID: waiterID,
                priority: get(Int64.self, at: 96),
                pid: get(Int32.self, at: 104),
                requestedMonotonic: get(UInt64.self, at: 112),
                requestedWallNanoseconds: get(Int64.self, at: 120),
                graceNanoseconds: get(UInt64.self, at: 128),
                maximumCriticalNanoseconds: get(UInt64.self, at: 136))
        }
        if version == 2 {
            let count = min(Int(get(UInt32.self, at: 216)), maximumWaiters)
            record.waiters.reserveCapacity(count)
            for index in 0..<count {
                let offset = waiterOffset + index * waiterSize
                record.waiters.append(WaiterSlot(
                    id: get(UInt64.self, at: offset),
                    pid: get(Int32.self, at: offset + 8),
                    priority: get(Int64.self, at: offset + 16),
                    sinceWallNanoseconds: get(Int64.self, at: offset + 24)))
            }
        }
        return record
    }

    /// Decodes one slot held in an array (tests).
    static func decode(_ slot: ArraySlice<UInt8>) -> RoleRecord? {
        slot.withUnsafeBytes { decode($0) }
    }

    private static func stateCode(_ state: RoleStatus.State) -> UInt8 {
        switch state {
        case .running: return 0
        case .stopping: return 1
        case .critical: return 2
        }
    }

    private static func state(_ code: UInt8) -> RoleStatus.State {
        switch code {
        case 1: return .stopping
        case 2: return .critical
        default: return .running
        }
    }

    /// What a whole record file holds: its newest valid slot (version 2, or else version 1 from
    /// an older Baton), how many of its two slots are valid, and whether it is all zeros (new).
    struct Reading {
        var newest: RoleRecord?
        var intactSlots: Int
        var isEmpty: Bool
    }

    static func read(in file: UnsafeRawBufferPointer) -> Reading {
        for size in [slotSize, version1SlotSize] {
            var best: RoleRecord?
            var intact = 0
            for index in 0..<2 where file.count >= (index + 1) * size {
                if let record = decode(UnsafeRawBufferPointer(rebasing: file[(index * size)..<((index + 1) * size)])) {
                    intact += 1
                    if record.sequence > (best?.sequence ?? 0) || best == nil { best = record }
                }
            }
            if let best { return Reading(newest: best, intactSlots: intact, isEmpty: false) }
        }
        return Reading(newest: nil, intactSlots: 0, isEmpty: file.allSatisfy { $0 == 0 })
    }
}
