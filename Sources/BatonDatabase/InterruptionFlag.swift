import CBatonShims
import GRDB
import GRDBSQLite
import Synchronization

/// A flag that interrupts SQLite statements while it is set: installed as each connection's
/// progress handler, it makes every statement that runs after the flag was set fail with
/// `SQLITE_INTERRUPT` (which rolls back a write transaction). Unlike `sqlite3_interrupt`, it
/// also stops statements that start after the flag was set.
final class InterruptionFlag: @unchecked Sendable {
    // @unchecked: the flag is one 32-bit word read and written only with atomic operations (so
    // that SQLite's progress handler, plain C, can read it).
    private let word: UnsafeMutablePointer<UInt32>
    /// The write guards' contexts (see ``installWriteGuard(on:)``), freed with the flag.
    fileprivate let guards = Mutex<[GuardedConnection]>([])

    /// Virtual machine steps between two checks of the flag. Small enough that even a one-row
    /// INSERT (about 20 steps) checks it at least once: `sqlite3_interrupt` is a no-op between
    /// statements, so a write made of many short statements would otherwise slip past a
    /// suspension. The check is one relaxed atomic load in C (`baton_flag_progress_handler`).
    static let checkInterval: Int32 = 8

    init() {
        word = .allocate(capacity: 1)
        word.initialize(to: 0)
    }

    deinit {
        for context in guards.withLock({ $0 }) { context.pointer.deallocate() }
        word.deallocate()
    }

    var isSet: Bool { baton_load32(word) != 0 }

    func set(_ newValue: Bool) { baton_store32(word, newValue ? 1 : 0) }

    /// Installs the flag as `db`'s progress handler. The flag must outlive the connection (the
    /// shared database owns both, and closes its connections first).
    func install(on db: Database) {
        sqlite3_progress_handler(db.sqliteConnection, Self.checkInterval, baton_flag_progress_handler, UnsafeMutableRawPointer(word))
    }

    /// Installs the flag as `db`'s write guard: while it is set, every statement that holds a
    /// write transaction when SQLite checks its progress handler fails with `SQLITE_INTERRUPT`,
    /// which rolls the transaction back and releases the write lock. Reads (`SELECT`,
    /// `BEGIN DEFERRED`, `PRAGMA data_version`) go on. SQLite checks the handler on loops and
    /// when a statement returns; with an interval of one step, even a `BEGIN IMMEDIATE` (four
    /// steps) is checked once it holds the lock, so no write can start while the flag is set.
    /// (The check is one relaxed load while the flag is clear, at a few points per statement.)
    /// The flag must outlive the connection.
    func installWriteGuard(on db: Database) {
        guard let connection = db.sqliteConnection else { return }
        let context = UnsafeMutablePointer<WriteGuardContext>.allocate(capacity: 1)
        context.initialize(to: WriteGuardContext(word: word, connection: connection))
        guards.withLock { $0.append(GuardedConnection(pointer: context)) }
        sqlite3_progress_handler(connection, 1, writeGuardHandler, UnsafeMutableRawPointer(context))
    }
}

extension InterruptionFlag {
    /// Interrupts the statement running now on every connection guarded by this flag
    /// (`sqlite3_interrupt`, which is safe from any thread while the connection is open).
    func interruptGuardedConnections() {
        guards.withLock { contexts in
            for context in contexts { sqlite3_interrupt(context.pointer.pointee.connection) }
        }
    }

    /// Forgets the guarded connections once they are closed.
    func forgetGuardedConnections() {
        let contexts = guards.withLock { contexts in
            defer { contexts = [] }
            return contexts
        }
        for context in contexts { context.pointer.deallocate() }
    }
}

/// A write guard's context, owned by its flag.
struct GuardedConnection: @unchecked Sendable {
    // @unchecked: the pointee is written once before SQLite gets it and only read afterwards;
    // the list of them is behind the flag's `guards` mutex.
    let pointer: UnsafeMutablePointer<WriteGuardContext>
}

/// What the write guard's progress handler reads: the flag and the connection it guards.
struct WriteGuardContext {
    let word: UnsafeMutablePointer<UInt32>
    let connection: OpaquePointer
}

/// The write guard (see ``InterruptionFlag/installWriteGuard(on:)``): nonzero, which interrupts
/// the statement, while the flag is set and the connection holds a write transaction.
private let writeGuardHandler: @convention(c) (UnsafeMutableRawPointer?) -> Int32 = { raw in
    guard let context = raw?.assumingMemoryBound(to: WriteGuardContext.self),
          baton_load32(context.pointee.word) != 0 else { return 0 }
    return sqlite3_txn_state(context.pointee.connection, nil) == SQLITE_TXN_WRITE ? 1 : 0
}

/// SQLite settings that GRDB does not expose.
enum SQLiteSettings {
    /// Keeps the `-wal` and `-shm` files when the last connection closes, so read-only
    /// connections can open the database while no writer runs (`SQLITE_FCNTL_PERSIST_WAL`).
    static func persistWAL(_ db: Database) throws {
        var flag: Int32 = 1
        let code = sqlite3_file_control(db.sqliteConnection, nil, SQLITE_FCNTL_PERSIST_WAL, &flag)
        guard code == SQLITE_OK else {
            throw DatabaseError(resultCode: ResultCode(rawValue: code), message: "could not enable persistent WAL")
        }
    }
}
