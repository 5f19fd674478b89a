import Baton

/// Read-only decoding of a database's writer queue (`.baton/database/<id>.queue`, a
/// ``TicketLock``) for `baton inspect`: from bytes the caller read, never a mapping or a lock.
package enum WriterQueueInspection {
    package struct Ticket: Sendable {
        package var ticket: UInt32
        /// 0 when the ticket was abandoned (its waiter gave up) or not yet claimed.
        package var pid: Int32
        package var token: UInt64
    }

    package struct Report: Sendable {
        /// The ticket being served (its holder writes, or keeps the turn), if any.
        package var holder: Ticket?
        package var waiters: [Ticket] = []
        /// Commits counted so far, and the process of the last one.
        package var commits: UInt64 = 0
        package var lastCommitPID: Int32 = 0
        /// Whether the holder keeps its turn while idle.
        package var kept = false
        package var damage: String?
    }

    package static func inspect(_ bytes: [UInt8]) -> Report {
        var report = Report()
        func u64(_ offset: Int) -> UInt64 {
            guard offset + 8 <= bytes.count else { return 0 }
            return bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: offset, as: UInt64.self)) }
        }
        func u32(_ offset: Int) -> UInt32 {
            guard offset + 4 <= bytes.count else { return 0 }
            return bytes.withUnsafeBytes { UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: offset, as: UInt32.self)) }
        }
        guard bytes.count >= TicketLock.fileSize else {
            report.damage = "the queue file is \(bytes.count) bytes, expected \(TicketLock.fileSize) (it holds no data: remove it)"
            return report
        }
        guard u64(0) == TicketLock.magic, u32(8) == TicketLock.version else {
            report.damage = "the queue file has an unknown format (it holds no data: remove it)"
            return report
        }
        let next = u32(TicketLock.nextOffset), serving = u32(TicketLock.servingOffset)
        report.commits = u64(TicketLock.sequenceOffset)
        report.lastCommitPID = Int32(truncatingIfNeeded: u64(TicketLock.lastPIDOffset))
        let outstanding = next &- serving
        guard outstanding <= UInt32(TicketLock.slotCount) else {
            report.damage = "\(outstanding) tickets outstanding, more than the queue's \(TicketLock.slotCount) slots"
            return report
        }
        var tickets: [Ticket] = []
        var ticket = serving
        while ticket != next {
            let slot = TicketLock.headerSize + Int(ticket % UInt32(TicketLock.slotCount)) * TicketLock.slotSize
            let owner = u64(slot)
            let claimed = UInt32(truncatingIfNeeded: owner >> 32) == ticket
            tickets.append(Ticket(ticket: ticket, pid: claimed ? Int32(truncatingIfNeeded: owner & 0xFFFF_FFFF) : 0, token: claimed ? u64(slot + 16) : 0))
            ticket &+= 1
        }
        let hold = u64(TicketLock.holdOffset)
        report.kept = UInt32(truncatingIfNeeded: hold >> 32) == serving && hold & TicketLock.holdKept != 0
        report.holder = tickets.first
        report.waiters = Array(tickets.dropFirst())
        return report
    }
}
