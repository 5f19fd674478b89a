#if canImport(FoundationEssentials)
import CBatonShims
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
/// - `holder-<epoch>.lock`: held exclusively by the holder of that epoch while it runs; the
///   kernel drops it the instant the holder dies or suspends itself.
/// - `waiter-<id>.lock`: held by each waiting process, with its priority, pid and kind inside;
///   a dead waiter's file is unlocked at once and removed by the next transition.
///
/// In a process, one instance exists per role (see ``RoleCore``); its mutex makes the arbiter
/// lock exclusive between the threads of the process too (`flock` alone only excludes other
/// open file descriptions).
final class RoleDirectory: Sendable {
    let container: SharedContainer
    let name: String
    /// `roles/<name>`, relative to `.baton`.
    let path: String

    private struct Descriptors {
        var arbiter: Int32
        var record: Int32
    }

    // The arbiter and record descriptors; holding this mutex is the in-process half of the
    // arbiter lock.
    private let descriptors: Mutex<Descriptors>

    init(container: SharedContainer, name: String) throws {
        try container.makeDirectory("roles")
        let path = "roles/" + name
        try container.makeDirectory(path)
        let arbiter = try container.openFile(path + "/arbiter.lock", flags: O_RDWR | O_CREAT)
        let record: Int32
        do {
            record = try container.openFile(path + "/record", flags: O_RDWR | O_CREAT)
        } catch {
            Sys.close(arbiter)
            throw error
        }
        self.container = container
        self.name = name
        self.path = path
        self.descriptors = Mutex(Descriptors(arbiter: arbiter, record: record))
    }

    deinit {
        descriptors.withLock { descriptors in
            Sys.close(descriptors.arbiter)
            Sys.close(descriptors.record)
        }
    }

    // MARK: Arbiter

    /// A transition: runs `body` holding the arbiter lock exclusively, with the current record.
    /// When `body` changes the record it is written back (synced when `durable` is set by body).
    func transition<R>(_ body: (inout Transaction) throws -> R) throws -> R {
        try descriptors.withLock { descriptors in
            try Sys.flock(descriptors.arbiter, LOCK_EX).get("locking the arbiter of role \(name)")
            defer { _ = Sys.flock(descriptors.arbiter, LOCK_UN) }
            let original = try readRecord(descriptors.record)
            var transaction = Transaction(record: original, directory: self)
            let result = try body(&transaction)
            if transaction.record != original {
                transaction.record.sequence = original.sequence &+ 1
                transaction.record.bootHash = BootSession.current
                transaction.record.heartbeatWallNanoseconds = Self.wallNanoseconds()
                let bytes = transaction.record.encode()
                let offset = Int(transaction.record.sequence % 2) * RoleRecord.slotSize
                try bytes.withUnsafeBytes {
                    try Sys.pwriteAll(descriptors.record, $0, at: offset).get("writing the record of role \(name)")
                }
                if transaction.durable {
                    try Sys.fdatasync(descriptors.record).get("syncing the record of role \(name)")
                }
            }
            return result
        }
    }

    /// Reads the record holding the arbiter lock shared (a consistent snapshot).
    func read<R>(_ body: (RoleRecord) throws -> R) throws -> R {
        try descriptors.withLock { descriptors in
            try Sys.flock(descriptors.arbiter, LOCK_SH).get("locking the arbiter of role \(name)")
            defer { _ = Sys.flock(descriptors.arbiter, LOCK_UN) }
            return try body(try readRecord(descriptors.record))
        }
    }

    private func readRecord(_ fd: Int32) throws -> RoleRecord {
        var bytes = [UInt8](repeating: 0, count: RoleRecord.fileSize)
        let count = try bytes.withUnsafeMutableBytes {
            try Sys.preadAll(fd, $0, at: 0).get("reading the record of role \(name)")
        }
        do {
            return try RoleRecord.newest(in: Array(bytes[0..<count])) ?? RoleRecord()
        } catch {
            return recoverCorruptRecord()
        }
    }

    /// Both slots failed their checksum (a disk error, or a foreign write): the holder is unknown
    /// and the epoch counter must still never go back. Restart it above every epoch named by a
    /// holder file and above the wall clock in microseconds; the next grant fences any holder
    /// that still believes in an older epoch.
    private func recoverCorruptRecord() -> RoleRecord {
        var floor = UInt64(max(Self.wallNanoseconds() / 1000, 0))
        for file in (try? fileNames()) ?? [] where file.hasPrefix("holder-") && file.hasSuffix(".lock") {
            if let epoch = UInt64(file.dropFirst("holder-".count).dropLast(".lock".count)) { floor = max(floor, epoch) }
        }
        var record = RoleRecord()
        record.lastEpoch = floor
        record.reservedEpoch = floor
        return record
    }

    // MARK: Files

    func holderFile(_ epoch: UInt64) -> String { path + "/holder-\(epoch).lock" }
    func waiterFile(_ id: UInt64) -> String { path + "/waiter-\(String(id, radix: 16)).lock" }

    /// Whether some process holds the lock of the holder of `epoch` (it is alive and not
    /// suspended). Opens read-only, so the check itself wakes nobody.
    func isHolderAlive(_ epoch: UInt64) throws -> Bool {
        try isLocked(holderFile(epoch))
    }

    private func isLocked(_ relativePath: String) throws -> Bool {
        let fd: Int32
        switch Sys.openat(container.directory, relativePath, O_RDONLY) {
        case .success(let value): fd = value
        case .failure(let error) where error.errno == ENOENT: return false
        case .failure(let error): throw BatonError.system(error, "opening \(relativePath)")
        }
        defer { Sys.close(fd) }
        return !(try Sys.tryFlock(fd, LOCK_SH).get("checking \(relativePath)"))
    }

    /// Creates and locks the holder file of a new epoch. Call inside a transition.
    func createHolderFile(_ epoch: UInt64) throws -> Int32 {
        let file = holderFile(epoch)
        let fd = try container.openFile(file, flags: O_RDWR | O_CREAT)
        do {
            guard try Sys.tryFlock(fd, LOCK_EX).get("locking \(file)") else {
                throw BatonError(.corrupt, "the holder file of epoch \(epoch) of role \(name) is locked by another process although that epoch was never granted; remove \(container.absolutePath(file))")
            }
        } catch {
            Sys.close(fd)
            throw error
        }
        return fd
    }

    /// Takes the lock of an existing holder file back (after a suspension). Call inside a
    /// transition that checked the record still names this process.
    func relockHolderFile(_ epoch: UInt64) throws -> Int32? {
        let file = holderFile(epoch)
        let fd = try container.openFile(file, flags: O_RDWR | O_CREAT)
        if try Sys.tryFlock(fd, LOCK_EX).get("locking \(file)") { return fd }
        Sys.close(fd)
        return nil
    }

    func removeFile(_ relativePath: String) {
        _ = Sys.unlinkat(container.directory, relativePath)
    }

    /// Creates, locks and fills this process's waiter file. Call inside a transition so that no
    /// one sees it unlocked.
    func createWaiterFile(_ id: UInt64, priority: RolePriority, kind: String) throws -> Int32 {
        let file = waiterFile(id)
        let fd = try container.openFile(file, flags: O_RDWR | O_CREAT | O_TRUNC)
        do {
            try Sys.flock(fd, LOCK_EX | LOCK_NB).get("locking \(file)")
            let line = "\(priority.value) \(getpid()) \(Self.wallNanoseconds()) \(kind)"
            try Array(line.utf8).withUnsafeBytes { try Sys.pwriteAll(fd, $0, at: 0).get("writing \(file)") }
        } catch {
            Sys.close(fd)
            removeFile(file)
            throw error
        }
        return fd
    }

    /// A live waiter read from its file.
    struct WaiterEntry: Sendable, Hashable {
        var id: UInt64
        var priority: RolePriority
        var pid: Int32
        var sinceWallNanoseconds: Int64
        var kind: String
    }

    /// The live waiters. With `removeDead`, files of dead waiters are deleted (only inside a
    /// transition).
    func liveWaiters(removeDead: Bool) throws -> [WaiterEntry] {
        var result: [WaiterEntry] = []
        for file in try fileNames() where file.hasPrefix("waiter-") && file.hasSuffix(".lock") {
            guard let id = UInt64(file.dropFirst("waiter-".count).dropLast(".lock".count), radix: 16) else { continue }
            let relative = path + "/" + file
            let fd: Int32
            switch Sys.openat(container.directory, relative, O_RDONLY) {
            case .success(let value): fd = value
            case .failure(let error) where error.errno == ENOENT: continue
            case .failure(let error): throw BatonError.system(error, "opening \(relative)")
            }
            defer { Sys.close(fd) }
            if try Sys.tryFlock(fd, LOCK_SH).get("checking \(relative)") {
                if removeDead { removeFile(relative) }
                continue
            }
            var buffer = [UInt8](repeating: 0, count: 512)
            let count = try buffer.withUnsafeMutableBytes { try Sys.preadAll(fd, $0, at: 0).get("reading \(relative)") }
            let fields = String(decoding: buffer[0..<count], as: UTF8.self).split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false)
            guard fields.count == 4, let priority = Int(fields[0]), let pid = Int32(fields[1]), let since = Int64(fields[2]) else {
                continue // still being written by its owner (it writes inside a transition)
            }
            result.append(WaiterEntry(id: id, priority: RolePriority(priority), pid: pid, sinceWallNanoseconds: since, kind: String(fields[3])))
        }
        return result.sorted { ($0.priority, -$0.sinceWallNanoseconds) > ($1.priority, -$1.sinceWallNanoseconds) }
    }

    /// Removes holder files of epochs other than `keep` that nobody holds.
    func removeStaleHolderFiles(keep: UInt64) throws {
        for file in try fileNames() where file.hasPrefix("holder-") && file.hasSuffix(".lock") {
            guard let epoch = UInt64(file.dropFirst("holder-".count).dropLast(".lock".count)), epoch != keep else { continue }
            if !(try isHolderAlive(epoch)) { removeFile(holderFile(epoch)) }
        }
    }

    private func fileNames() throws -> [String] {
        let fd = try container.openFile(path, flags: O_RDONLY | O_DIRECTORY)
        guard let stream = fdopendir(fd) else {
            Sys.close(fd)
            throw BatonError.system(SystemCallError(call: "fdopendir", errno: errno), "listing role \(name)")
        }
        defer { closedir(stream) }
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            names.append(name)
        }
        return names
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
            if record.bootHash != BootSession.current {
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
