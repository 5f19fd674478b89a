import CBatonShims
import GRDB
import GRDBSQLite

/// A flag that interrupts SQLite statements while it is set: installed as each connection's
/// progress handler, it makes every statement that runs after the flag was set fail with
/// `SQLITE_INTERRUPT` (which rolls back a write transaction). Unlike `sqlite3_interrupt`, it
/// also stops statements that start after the flag was set.
final class InterruptionFlag: @unchecked Sendable {
    // @unchecked: the flag is one 32-bit word read and written only with atomic operations (so
    // that SQLite's progress handler, plain C, can read it).
    private let word: UnsafeMutablePointer<UInt32>

    /// Virtual machine steps between two checks of the flag. Small enough that even a one-row
    /// INSERT (about 20 steps) checks it at least once: `sqlite3_interrupt` is a no-op between
    /// statements, so a write made of many short statements would otherwise slip past a
    /// suspension. The check is one relaxed atomic load in C (`baton_flag_progress_handler`).
    static let checkInterval: Int32 = 8

    init() {
        word = .allocate(capacity: 1)
        word.initialize(to: 0)
    }

    deinit { word.deallocate() }

    var isSet: Bool { baton_load32(word) != 0 }

    func set(_ newValue: Bool) { baton_store32(word, newValue ? 1 : 0) }

    /// Installs the flag as `db`'s progress handler. The flag must outlive the connection (the
    /// shared database owns both, and closes its connections first).
    func install(on db: Database) {
        sqlite3_progress_handler(db.sqliteConnection, Self.checkInterval, baton_flag_progress_handler, UnsafeMutableRawPointer(word))
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
