#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Read-only decoding of Baton's files for `baton inspect`: each function takes bytes that the
/// caller read (never a mapping, never a lock), checks them the way the library would, and says
/// what is damaged instead of repairing it. Nothing here writes, creates or removes a file.
package enum Inspection {
    /// `owners/<token>`, relative to `.baton`: the file whose `flock` says the token's process lives.
    package static func ownerTokenFile(_ token: UInt64) -> String { OwnerTokens.path(token) }

    private static func u32(_ bytes: [UInt8], _ offset: Int) -> UInt32 {
        guard offset + 4 <= bytes.count else { return 0 }
        return bytes.withUnsafeBytes { UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: offset, as: UInt32.self)) }
    }

    private static func u64(_ bytes: [UInt8], _ offset: Int) -> UInt64 {
        guard offset + 8 <= bytes.count else { return 0 }
        return bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: offset, as: UInt64.self)) }
    }

    private static func date(_ nanoseconds: Int64) -> Date { Date(timeIntervalSince1970: Double(nanoseconds) / 1e9) }

    // MARK: Roles

    /// A role's record, `.baton/roles/<name>/record`.
    package struct Role: Sendable {
        package struct Holder: Sendable {
            package var epoch: UInt64
            package var priority: Int
            package var pid: Int32
            package var kind: String
            package var state: String
            package var since: Date
            /// Its lock file, relative to the role's directory: locked while the holder lives.
            package var lockFile: String
            package var stopRequest: (priority: Int, pid: Int32, deadline: Date)?
        }
        package struct Waiter: Sendable {
            package var pid: Int32
            package var priority: Int
            package var since: Date
            /// Its lock file, relative to the role's directory: locked while the waiter waits.
            package var lockFile: String
        }
        package var lastEpoch: UInt64 = 0
        package var holder: Holder?
        package var waiters: [Waiter] = []
        package var heartbeat: Date?
        package var intactSlots = 0
        /// What is wrong with the record, if anything.
        package var damage: String?
    }

    package static func role(record bytes: [UInt8]) -> Role {
        var role = Role()
        let reading = bytes.withUnsafeBytes { RoleRecord.read(in: $0) }
        role.intactSlots = reading.intactSlots
        guard let record = reading.newest else {
            role.damage = reading.isEmpty
                ? nil
                : "no intact slot in the record (\(bytes.count) bytes): the holder and epoch are unreadable; the next process to open the role recovers the epoch"
            return role
        }
        if bytes.count < RoleRecord.fileSize {
            role.damage = "the record is \(bytes.count) bytes, expected \(RoleRecord.fileSize) (cut short)"
        } else if reading.intactSlots < 2 {
            role.damage = "one of the record's two slots failed its checksum (a torn write; the other slot is used)"
        }
        role.lastEpoch = record.lastEpoch
        role.heartbeat = record.heartbeatWallNanoseconds == 0 ? nil : date(record.heartbeatWallNanoseconds)
        if let entry = record.holder {
            role.holder = Role.Holder(
                epoch: entry.epoch, priority: Int(entry.priority), pid: entry.pid, kind: entry.kind,
                state: entry.state.rawValue, since: date(entry.sinceWallNanoseconds),
                lockFile: "holder-\(entry.pid)-\(String(entry.lockID, radix: 16)).lock",
                stopRequest: record.stop.map { ($0.priority, $0.pid) }.map { stop in
                    (Int(stop.0), stop.1, date(record.stop!.deadlineWallNanoseconds(holderState: entry.state)))
                })
        }
        role.waiters = record.waiters.map {
            Role.Waiter(pid: $0.pid, priority: Int($0.priority), since: date($0.sinceWallNanoseconds),
                        lockFile: "waiter-\($0.pid)-\(String($0.id, radix: 16)).lock")
        }
        return role
    }

    // MARK: Defaults

    /// A defaults suite: `.baton/defaults/<suite>.meta` and `.log`.
    package struct DefaultsSuite: Sendable {
        /// The keys set, after replaying the committed records.
        package var keys: [String] = []
        package var logBytes = 0
        /// The committed length the meta file names.
        package var committedBytes = 0
        /// Records that failed their checksum inside the committed part.
        package var corruptBytes = 0
        package var corruptRegions = 0
        /// Non-zero bytes after the committed part (a write torn by a crash, repaired on next open).
        package var tornTailBytes = 0
        /// Processes watching the suite.
        package var watchers = 0
        package var damage: [String] = []
    }

    package static func defaults(meta: [UInt8]?, log: [UInt8]) -> DefaultsSuite {
        var suite = DefaultsSuite()
        suite.logBytes = log.count
        let logGeneration = log.withUnsafeBytes { raw in
            raw.baseAddress.flatMap { DefaultsLogFormat.readHeader($0, size: raw.count) }
        }
        if logGeneration == nil { suite.damage.append("the log's header is missing or failed its checksum") }
        var committedLength = log.count
        if let meta {
            if meta.count < DefaultsMeta.size || u64(meta, 0) != DefaultsMeta.magic || u32(meta, 8) != DefaultsMeta.version {
                suite.damage.append("the meta file's header is invalid (it is rebuilt from the log on next open)")
            } else {
                let committed = u64(meta, DefaultsMeta.committedOffset)
                committedLength = Int(committed & DefaultsLogFormat.lengthMask)
                suite.committedBytes = committedLength
                suite.watchers = Int(u32(meta, DefaultsMeta.watchersOffset))
                if let logGeneration, (logGeneration & DefaultsLogFormat.generationMask) != committed >> DefaultsLogFormat.lengthBits {
                    suite.damage.append("the meta file names log generation \(committed >> DefaultsLogFormat.lengthBits), the log is generation \(logGeneration & DefaultsLogFormat.generationMask) (a compaction was interrupted)")
                }
            }
        } else {
            suite.damage.append("the meta file is missing")
        }
        if committedLength > log.count {
            suite.damage.append("the meta file says \(committedLength) bytes are committed, the log has \(log.count) (cut short)")
            committedLength = log.count
        }
        guard logGeneration != nil, committedLength >= DefaultsLogFormat.headerSize else {
            return suite
        }
        var keys: Set<String> = []
        let scan = log.withUnsafeBytes { raw -> DefaultsLogFormat.Scan in
            DefaultsLogFormat.scan(raw.baseAddress!, from: DefaultsLogFormat.headerSize, to: committedLength) { _, entries in
                for entry in entries {
                    let key = String(decoding: raw[entry.keyOffset..<(entry.keyOffset + entry.keyLength)], as: UTF8.self)
                    switch entry.operation {
                    case .set: keys.insert(key)
                    case .remove: keys.remove(key)
                    case .fence: break
                    }
                }
            }
        }
        suite.keys = keys.sorted()
        suite.corruptBytes = scan.corruptBytes
        suite.corruptRegions = scan.corruptRegions
        if let start = scan.invalidTailStart {
            suite.corruptBytes += committedLength - start
            suite.corruptRegions += 1
        }
        if suite.corruptRegions > 0 {
            suite.damage.append("\(suite.corruptBytes) committed bytes in \(suite.corruptRegions) regions failed their checksums (their values are lost)")
        }
        if committedLength < log.count {
            suite.tornTailBytes = log.withUnsafeBytes { raw in
                DefaultsLogFormat.hasNonZeroByte(raw.baseAddress!, committedLength..<raw.count) ? raw.count - committedLength : 0
            }
        }
        return suite
    }

    // MARK: Channels

    /// A channel's header, `.baton/channels/<name>`.
    package struct Channel: Sendable {
        package var capacity = "?"
        /// Elements ready to be received.
        package var depth = 0
        /// Elements taken by a receiver and not yet acknowledged.
        package var taken = 0
        package var closed = false
        package var waitingReceivers = 0
        /// Processes asleep on the "readable" and "writable" doorbells.
        package var sleepingReceivers = 0
        package var sleepingSenders = 0
        /// The owner tokens of the processes registered as receivers.
        package var receiverTokens: [UInt64] = []
        package var damage: String?
    }

    package static func channel(header bytes: [UInt8]) -> Channel {
        var channel = Channel()
        guard bytes.count >= ChannelLog.headerSize else {
            channel.damage = "the file is \(bytes.count) bytes, shorter than a channel header (\(ChannelLog.headerSize))"
            return channel
        }
        var copy = bytes
        let checksum = copy.withUnsafeMutableBytes { ChannelLog.headerChecksum($0.baseAddress!) }
        guard u64(bytes, ChannelLog.oMagic) == ChannelLog.magic, u32(bytes, ChannelLog.oCRC) == checksum else {
            channel.damage = "not a Baton channel, or its header failed its checksum"
            return channel
        }
        guard u32(bytes, ChannelLog.oVersion) == ChannelLog.version else {
            channel.damage = "format version \(u32(bytes, ChannelLog.oVersion)); this Baton reads version \(ChannelLog.version)"
            return channel
        }
        if let capacity = ChannelCapacity(storedKind: u32(bytes, ChannelLog.oKind), count: u64(bytes, ChannelLog.oCount)) {
            channel.capacity = capacity.description
        } else {
            channel.damage = "an unknown capacity"
        }
        channel.depth = Int(truncatingIfNeeded: u64(bytes, ChannelLog.oReady))
        channel.taken = Int(truncatingIfNeeded: u64(bytes, ChannelLog.oTaken))
        channel.closed = u32(bytes, ChannelLog.oClosed) != 0
        // Receivers waiting on a rendezvous channel are registered in the header (a waiter that
        // died is cleared by the next process that registers, so it may still count here).
        channel.waitingReceivers = (0..<ChannelLog.registrationCount).filter {
            u64(bytes, ChannelLog.oRegistrations + $0 * ChannelLog.registrationSize) != 0
        }.count
        channel.sleepingReceivers = Int(u32(bytes, ChannelLog.oReadableSleepers))
        channel.sleepingSenders = Int(u32(bytes, ChannelLog.oWritableSleepers))
        if channel.depth < 0 || channel.taken < 0 || channel.waitingReceivers < 0 {
            channel.damage = "negative counts in the header (repaired on next open)"
        }
        channel.receiverTokens = (0..<ChannelLog.maxParticipants).map { u64(bytes, ChannelLog.participantOffset + $0 * 8) }.filter { $0 != 0 }
        return channel
    }

    // MARK: Signals

    /// The signal table, `.baton/signals`.
    package struct Signals: Sendable {
        package struct Name: Sendable {
            package var name: String
            package var counter: UInt64
            package var state: UInt64
            package var observers: Int
        }
        package var names: [Name] = []
        package var slotCount = SignalTable.slotCount
        /// Owner tokens of the processes with an entry (observing), and their pids.
        package var processes: [(pid: Int32, token: UInt64)] = []
        package var retired = false
        package var damage: String?
    }

    package static func signals(table bytes: [UInt8]) -> Signals {
        var table = Signals()
        guard bytes.count >= SignalTable.headerSize else {
            table.damage = "the table is \(bytes.count) bytes, shorter than its header (it is rebuilt on next use)"
            return table
        }
        let checksum = bytes.withUnsafeBytes { Checksum.crc32c(UnsafeRawBufferPointer(rebasing: $0[0..<20])) }
        guard u64(bytes, 0) == SignalTable.magic, u32(bytes, 8) == SignalTable.version,
              u32(bytes, 12) == UInt32(SignalTable.slotCount), u32(bytes, 16) == UInt32(SignalTable.slotSize),
              u32(bytes, 20) == checksum
        else {
            table.damage = "the table's header failed its checks (it holds nothing durable and is rebuilt on next use)"
            return table
        }
        table.retired = u32(bytes, 24) != 0
        if bytes.count < SignalTable.fileSize {
            table.damage = "the table is \(bytes.count) bytes, expected \(SignalTable.fileSize) (cut short; it is extended on next use)"
        }
        for index in 0..<SignalTable.entryCount {
            let offset = SignalTable.entryOffset + index * SignalTable.entrySize
            let token = u64(bytes, offset + 24)
            if token != 0 { table.processes.append((Int32(bitPattern: u32(bytes, offset)), token)) }
        }
        var damagedSlots = 0
        for slot in 0..<SignalTable.slotCount {
            let base = SignalTable.headerSize + slot * SignalTable.slotSize
            guard base + SignalTable.slotSize <= bytes.count, u32(bytes, base) == 1 else { continue }
            let length = Int(u32(bytes, base + 4))
            guard length >= 1, length <= 128 else {
                damagedSlots += 1
                continue
            }
            let name = String(decoding: bytes[(base + 40)..<(base + 40 + length)], as: UTF8.self)
            table.names.append(Signals.Name(name: name, counter: u64(bytes, base + 16), state: u64(bytes, base + 24), observers: Int(u32(bytes, base + 32))))
        }
        if damagedSlots > 0, table.damage == nil { table.damage = "\(damagedSlots) slots have an invalid name length" }
        table.names.sort { $0.name < $1.name }
        return table
    }
}
