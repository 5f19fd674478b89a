import CBatonShims
import GRDB
import GRDBSQLite
import Synchronization

/// A flag that interrupts SQLite statements while it is set: installed as a connection's
/// progress handler, it makes the statements that run after the flag was set fail with
/// `SQLITE_INTERRUPT` (which rolls back a write transaction): every statement of a reader
/// connection (``install(on:)``), the statements of a write transaction on the writer connection
/// (``installOnWriter(_:all:)``). Unlike `sqlite3_interrupt`, it also stops statements that start
/// after the flag was set.
final class InterruptionFlag: @unchecked Sendable {
    // @unchecked: the flag is one 32-bit word read and written only with atomic operations (so
    // that SQLite's progress handler, plain C, can read it); the writer contexts are only
    // touched under their mutex, and freed with the flag.
    private let word: UnsafeMutablePointer<UInt32>
    /// The addresses of the progress handler contexts of the writer connections the flag was
    /// installed on (one per pool opened).
    private let writerContexts = Mutex<[UInt]>([])

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
        writerContexts.withLock { contexts in
            for address in contexts { UnsafeMutableRawPointer(bitPattern: address)?.deallocate() }
        }
        word.deallocate()
    }

    var isSet: Bool { baton_load32(word) != 0 }

    func set(_ newValue: Bool) { baton_store32(word, newValue ? 1 : 0) }

    /// Installs the flag as `db`'s progress handler. The flag must outlive the connection (the
    /// shared database owns both, and closes its connections first).
    func install(on db: Database) {
        sqlite3_progress_handler(db.sqliteConnection, Self.checkInterval, baton_flag_progress_handler, UnsafeMutableRawPointer(word))
    }

    /// Installs the flag as the progress handler of `db`, a writer connection: while the flag is
    /// set, the statements that run in a write transaction fail; a read outside one runs on (it
    /// holds no write lock; GRDB runs the fetches of its observations there, and an interrupted
    /// fetch ends the observation for good). While `all` is set, every statement fails. Both
    /// flags must outlive the connection.
    func installOnWriter(_ db: Database, all: InterruptionFlag) {
        let context = UnsafeMutablePointer<baton_writer_interruption>.allocate(capacity: 1)
        context.initialize(to: baton_writer_interruption(
            writes: UnsafePointer(word), all: UnsafePointer(all.word),
            connection: db.sqliteConnection, transaction_state: sqlite3_txn_state))
        writerContexts.withLock { $0.append(UInt(bitPattern: context)) }
        sqlite3_progress_handler(db.sqliteConnection, Self.checkInterval, baton_writer_progress_handler, UnsafeMutableRawPointer(context))
    }
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
