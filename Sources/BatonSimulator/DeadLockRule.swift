import BatonDatabase
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// The rule the simulator applies at each suspension to decide a 0xDEAD10CC kill.
///
/// ``apple`` is the rule of Apple's TN2408 ("Accessing Shared Data from an App Extension and
/// its Containing App"), decided from the byte ranges of the locks a process holds:
/// - (a) any `flock`, `fcntl` or OFD lock on a file that is not a recognised SQLite database;
/// - (b) any lock on a SQLite database in a rollback-journal mode (header bytes 18–19 not 2)
///   or whose header is not recognised (the first 16 bytes are not `SQLite format 3\0`,
///   as with an encrypted database without a plaintext header);
/// - (c) a WAL write transaction: a lock on the database's PENDING (`0x40000000`) or RESERVED
///   (`0x40000001`) byte, a write lock on its SHARED range (`0x40000002`, 510 bytes: EXCLUSIVE),
///   or a lock on the WAL write lock, byte 120 of the `-shm` file (`WALINDEX_LOCK_OFFSET`,
///   `UNIX_SHM_BASE` + `WAL_WRITE_LOCK`).
///
/// The `-wal`, `-shm` and `-journal` files of a recognised database count as that database; WAL
/// read locks (a read lock on the SHARED range, the `-shm` read marks at 123–127), the
/// checkpoint and recovery locks (121, 122) and the DMS lock (128) are allowed.
///
/// ``strict`` kills for any lock on any file of the container.
public enum DeadLockRule: String, Sendable, CaseIterable, Codable {
    /// The environment variable through which the simulator tells the programs it runs which
    /// rule it enforces (`apple` or `strict`), so that they can release what that rule forbids.
    public static let environmentVariable = "BATON_DEAD10CC_RULE"

    /// The rule named by ``environmentVariable`` in this process's environment, if any.
    public static var fromEnvironment: DeadLockRule? {
        getenv(environmentVariable).flatMap { DeadLockRule(rawValue: String(cString: $0)) }
    }

    /// How a shared database should suspend under this rule: Apple's rule allows an idle WAL
    /// connection to stay open (only a write transaction is killed), the strict one allows no
    /// lock at all.
    public var databaseSuspensionMode: SharedDatabase.SuspensionMode {
        self == .strict ? .closesConnections : .rollsBackWrites
    }

    case apple
    case strict

    /// Why a held lock gets the process killed.
    public enum Clause: String, Sendable, Hashable, Codable {
        /// (a) A lock on a file that is not a recognised SQLite database.
        case notADatabase = "a"
        /// (b) A lock on a SQLite database in a rollback-journal mode or with a header that is not recognised.
        case rollbackOrUnrecognised = "b"
        /// (c) A WAL write transaction.
        case walWriteTransaction = "c"
        /// The strict rule: any lock in the container.
        case anyLock = "strict"

        /// The clause in words.
        public var summary: String {
            switch self {
            case .notADatabase: "(a) a lock on a file that is not a recognised SQLite database"
            case .rollbackOrUnrecognised: "(b) a lock on a SQLite database in rollback-journal mode or whose header is not recognised"
            case .walWriteTransaction: "(c) a WAL write transaction"
            case .anyLock: "strict: any lock in the shared container"
            }
        }
    }

    /// A lock that breaks the rule.
    public struct Violation: Sendable, Hashable, CustomStringConvertible {
        public var lock: ProcFS.HeldLock
        public var clause: Clause
        /// What made the clause apply (the byte's name, the journal mode).
        public var reason: String

        public var description: String {
            "\(lock) — \(clause.summary): \(reason)"
        }
    }

    // SQLite's lock bytes (sqlite3.c: PENDING_BYTE, RESERVED_BYTE, SHARED_FIRST, SHARED_SIZE;
    // os_unix.c: UNIX_SHM_BASE = WALINDEX_LOCK_OFFSET = 120, lock i at 120 + i, UNIX_SHM_DMS = 128).
    static let pendingByte: UInt64 = 0x4000_0000
    static let reservedByte: UInt64 = pendingByte + 1
    static let sharedFirst: UInt64 = pendingByte + 2
    static let sharedSize: UInt64 = 510
    static let walWriteLock: UInt64 = 120

    /// What the system sees of a database: its first bytes.
    public enum DatabaseHeader: Sendable, Hashable {
        /// `SQLite format 3\0` with WAL version bytes (18 and 19 are 2).
        case wal
        /// `SQLite format 3\0` in a rollback-journal mode (DELETE, TRUNCATE, PERSIST...).
        case rollbackJournal
        /// Not a SQLite header (encrypted, empty, or another format).
        case unrecognised

        /// Classifies the first bytes of a file.
        public init(_ bytes: [UInt8]) {
            let magic = Array("SQLite format 3".utf8) + [0]
            guard bytes.count >= 20, Array(bytes.prefix(16)) == magic else {
                self = .unrecognised
                return
            }
            self = bytes[18] == 2 && bytes[19] == 2 ? .wal : .rollbackJournal
        }
    }

    /// The locks among `locks` that break this rule.
    /// - Parameters:
    ///   - locks: Locks one process holds on files of the container (paths relative to it).
    ///   - header: The first 100 bytes of a file of the container, nil when it cannot be read.
    /// - Returns: Each lock that gets the process killed, with its clause.
    public func violations(_ locks: [ProcFS.HeldLock], header: (String) -> [UInt8]?) -> [Violation] {
        locks.compactMap { lock in
            switch self {
            case .strict: Violation(lock: lock, clause: .anyLock, reason: "the strict rule allows no lock")
            case .apple: Self.appleViolation(lock, header: header)
            }
        }
    }

    /// The database a file belongs to: itself, or the database of a `-wal`, `-shm` or `-journal` file.
    static func databasePath(of path: String) -> (database: String, suffix: String) {
        for suffix in ["-wal", "-shm", "-journal"] where path.hasSuffix(suffix) {
            return (String(path.dropLast(suffix.count)), suffix)
        }
        return (path, "")
    }

    private static func appleViolation(_ lock: ProcFS.HeldLock, header: (String) -> [UInt8]?) -> Violation? {
        let (database, suffix) = databasePath(of: lock.path)
        let bytes = header(database) ?? []
        let kind = DatabaseHeader(bytes)
        // A file SQLite would lock (its lock page, or a companion file) but with no recognised header.
        let withinLockPage = lock.kind != "FLOCK" && lock.start >= pendingByte && (lock.end ?? .max) < sharedFirst + sharedSize
        let looksLikeSQLite = !suffix.isEmpty || withinLockPage
        switch kind {
        case .unrecognised where looksLikeSQLite && !bytes.isEmpty:
            return Violation(lock: lock, clause: .rollbackOrUnrecognised, reason: "\(database)'s header is not \"SQLite format 3\\0\" (encrypted?), so the system does not recognise it as a database")
        case .unrecognised:
            return Violation(lock: lock, clause: .notADatabase, reason: "\(lock.path) is not a recognised SQLite database")
        case .rollbackJournal:
            return Violation(lock: lock, clause: .rollbackOrUnrecognised, reason: "\(database) is in a rollback-journal mode (header bytes 18–19 are not 2: not WAL)")
        case .wal:
            return walViolation(lock, suffix: suffix)
        }
    }

    private static func walViolation(_ lock: ProcFS.HeldLock, suffix: String) -> Violation? {
        if lock.kind == "FLOCK" {
            return Violation(lock: lock, clause: .notADatabase, reason: "a whole-file flock is not part of SQLite's locking: the system treats it as a plain file lock")
        }
        switch suffix {
        case "":
            if lock.overlaps(pendingByte, pendingByte) {
                return Violation(lock: lock, clause: .walWriteTransaction, reason: "the PENDING byte (0x40000000)")
            }
            if lock.overlaps(reservedByte, reservedByte) {
                return Violation(lock: lock, clause: .walWriteTransaction, reason: "the RESERVED byte (0x40000001)")
            }
            if lock.exclusive && lock.overlaps(sharedFirst, sharedFirst + sharedSize - 1) {
                return Violation(lock: lock, clause: .walWriteTransaction, reason: "an EXCLUSIVE lock (write lock on the SHARED range 0x40000002+510)")
            }
            if !lock.overlaps(pendingByte, sharedFirst + sharedSize - 1) {
                return Violation(lock: lock, clause: .notADatabase, reason: "a byte range outside SQLite's lock page is not part of SQLite's locking")
            }
            return nil
        case "-shm":
            if lock.overlaps(walWriteLock, walWriteLock) {
                return Violation(lock: lock, clause: .walWriteTransaction, reason: "the WAL write lock (byte 120 of -shm: WALINDEX_LOCK_OFFSET + WAL_WRITE_LOCK)")
            }
            return nil
        default:
            return nil
        }
    }
}

extension ProcFS {
    /// A lock one process holds on a file of the container, with its byte range.
    public struct HeldLock: Sendable, Hashable, CustomStringConvertible {
        /// The file, relative to the container.
        public var path: String
        /// `FLOCK`, `POSIX` or `OFDLCK`.
        public var kind: String
        /// A write (exclusive) lock rather than a read (shared) one.
        public var exclusive: Bool
        /// The first byte locked.
        public var start: UInt64
        /// The last byte locked; nil to the end of the file (and beyond).
        public var end: UInt64?

        public init(path: String, kind: String, exclusive: Bool, start: UInt64 = 0, end: UInt64? = nil) {
            self.path = path
            self.kind = kind
            self.exclusive = exclusive
            self.start = start
            self.end = end
        }

        /// Whether the lock covers any byte of `first...last`.
        public func overlaps(_ first: UInt64, _ last: UInt64) -> Bool {
            start <= last && (end ?? .max) >= first
        }

        /// The byte range in hexadecimal when high, as `/proc/locks` would say it (`0-EOF`).
        public var range: String {
            func show(_ value: UInt64) -> String { value >= 0x1000 ? "0x" + String(value, radix: 16) : String(value) }
            return kind == "FLOCK" ? "whole file" : "bytes \(show(start))-\(end.map(show) ?? "EOF")"
        }

        public var description: String {
            "\(kind) \(exclusive ? "WRITE" : "READ") lock, \(range), on \(path)"
        }
    }
}
