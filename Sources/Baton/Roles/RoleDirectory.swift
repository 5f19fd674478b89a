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
/// - `holder-<pid>-<id>.lock`: one per process, locked exclusively while that process holds
///   the role (the record names the file of the current holder); the kernel drops the lock the
///   instant the holder dies or suspends itself. An overtaken holder still locks its own file,
///   which no longer matters: the record names the new holder's file.
/// - `waiter-<pid>-<id>.lock`: one per process, locked while it waits, with its priority, pid
///   and kind inside. Files of dead processes are removed by later transitions.
///
/// In a process, one instance exists per role (see ``RoleCore``); its mutex makes the arbiter
/// lock exclusive between the threads of the process too (`flock` alone only excludes other
/// open file descriptions).
final class RoleDirectory: Sendable {
    let container: SharedContainer
    let name: String
    /// `roles/<name>`, relative to `.baton`.
    let path: String

    private struct Descriptors: @unchecked Sendable {
        // @unchecked: the mapping is only touched while holding the `descriptors` mutex (and,
        // across processes, the arbiter lock).
        var arbiter: Int32
        /// The record, mapped: writing through the mapping neither allocates nor updates the
        /// file's times on every change, so no transition waits for the file system's journal.
        var record: MappedFile
    }

    // The arbiter descriptor and the record's mapping; holding this mutex is the in-process
    // half of the arbiter lock.
    private let descriptors: Mutex<Descriptors>

    init(container: SharedContainer, name: String) throws {
        try container.makeDirectory("roles")
        let path = "roles/" + name
        try container.makeDirectory(path)
        let arbiter = try container.openFile(path + "/arbiter.lock", flags: O_RDWR | O_CREAT)
        let record: MappedFile
        do {
            record = try MappedFile(container, relativePath: path + "/record", minimumSize: RoleRecord.fileSize)
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
        }
    }

    // MARK: Arbiter

    /// Runs `body` excluding this process's transitions (not other processes): for suspension,
    /// so that no transition locks a file after the suspension closed it.
    func excludingTransitions<R>(_ body: () -> R) -> R {
        descriptors.withLock { _ in body() }
    }

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
                bytes.withUnsafeBytes {
                    descriptors.record.pointer.advanced(by: offset).copyMemory(from: $0.baseAddress!, byteCount: $0.count)
                }
                if transaction.durable {
                    try descriptors.record.sync()
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

    private func readRecord(_ record: MappedFile) throws -> RoleRecord {
        let count = min(record.size, RoleRecord.fileSize)
        let bytes = [UInt8](UnsafeRawBufferPointer(start: record.pointer, count: count))
        do {
            return try RoleRecord.newest(in: bytes) ?? RoleRecord()
        } catch {
            return recoverCorruptRecord()
        }
    }

    /// Both slots failed their checksum (a disk error, or a foreign write): the holder is unknown
    /// and the epoch counter must still never go back. Restart it above every epoch named by a
    /// holder file and above the wall clock in microseconds; the next grant fences any holder
    /// that still believes in an older epoch. (Epochs normally count from 1, far below the wall
    /// clock in microseconds.)
    private func recoverCorruptRecord() -> RoleRecord {
        let floor = UInt64(max(Self.wallNanoseconds() / 1000, 0))
        var record = RoleRecord()
        record.lastEpoch = floor
        record.reservedEpoch = floor
        return record
    }

    // MARK: Files

    /// The lock file of a holder.
    func holderFile(_ holder: RoleRecord.HolderEntry) -> String {
        RoleLockFile.relativePath(directory: self, prefix: "holder", pid: holder.pid, id: holder.lockID)
    }

    /// Whether the holder still holds its lock file (it is alive and not suspended). Opens
    /// read-only, so the check itself wakes nobody.
    func isHolderAlive(_ holder: RoleRecord.HolderEntry) throws -> Bool {
        try isLocked(holderFile(holder))
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

    func removeFile(_ relativePath: String) {
        _ = Sys.unlinkat(container.directory, relativePath)
    }

    /// Whether process `pid` is gone (its files may be removed).
    static func isDead(_ pid: Int32) -> Bool {
        guard pid != getpid(), case .failure(let error) = Sys.kill(pid, 0) else { return false }
        return error.errno == ESRCH
    }

    /// Removes the lock file of a previous holder whose process is gone.
    func removeIfDead(_ holder: RoleRecord.HolderEntry) {
        if Self.isDead(holder.pid) { removeFile(holderFile(holder)) }
    }

    /// The text of a waiter file.
    static func waiterContent(priority: RolePriority, kind: String) -> String {
        "\(priority.value) \(getpid()) \(wallNanoseconds()) \(kind)"
    }

    /// A live waiter read from its file.
    struct WaiterEntry: Sendable, Hashable {
        var id: UInt64
        var priority: RolePriority
        var pid: Int32
        var sinceWallNanoseconds: Int64
        var kind: String
    }

    /// The waiters whose files are locked now, highest priority first, excluding `excluding`.
    /// With `removeDead`, files of dead processes are deleted (only inside a transition).
    func liveWaiters(excluding: UInt64 = 0, removeDead: Bool) throws -> [WaiterEntry] {
        var result: [WaiterEntry] = []
        for file in try fileNames() {
            guard let (pid, id) = RoleLockFile.parse(file, prefix: "waiter"), id != excluding else { continue }
            let relative = path + "/" + file
            let fd: Int32
            switch Sys.openat(container.directory, relative, O_RDONLY) {
            case .success(let value): fd = value
            case .failure(let error) where error.errno == ENOENT: continue
            case .failure(let error): throw BatonError.system(error, "opening \(relative)")
            }
            defer { Sys.close(fd) }
            if try Sys.tryFlock(fd, LOCK_SH).get("checking \(relative)") {
                if removeDead, Self.isDead(pid) { removeFile(relative) }
                continue
            }
            var buffer = [UInt8](repeating: 0, count: 512)
            let count = try buffer.withUnsafeMutableBytes { try Sys.preadAll(fd, $0, at: 0).get("reading \(relative)") }
            let text = String(decoding: buffer[0..<count], as: UTF8.self).prefix { $0 != "\n" }
            let fields = text.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false)
            guard fields.count == 4, let priority = Int(fields[0]), let since = Int64(fields[2]) else { continue }
            result.append(WaiterEntry(id: id, priority: RolePriority(priority), pid: pid, sinceWallNanoseconds: since, kind: String(fields[3])))
        }
        return result.sorted { ($0.priority, -$0.sinceWallNanoseconds) > ($1.priority, -$1.sinceWallNanoseconds) }
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
