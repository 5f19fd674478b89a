import GRDB
import GRDBSQLite
import Synchronization

/// A flag that interrupts SQLite statements while it is set: installed as each connection's
/// progress handler, it makes every statement that runs after the flag was set fail with
/// `SQLITE_INTERRUPT` (which rolls back a write transaction). Unlike `sqlite3_interrupt`, it
/// also stops statements that start after the flag was set.
final class InterruptionFlag: Sendable {
    private let value = Atomic<Bool>(false)

    /// Virtual machine steps between two checks of the flag. Small enough that even a one-row
    /// INSERT (about 20 steps) checks it at least once: `sqlite3_interrupt` is a no-op between
    /// statements, so a write made of many short statements would otherwise slip past a
    /// suspension. The check is one relaxed atomic load.
    static let checkInterval: Int32 = 8

    var isSet: Bool { value.load(ordering: .relaxed) }

    func set(_ newValue: Bool) { value.store(newValue, ordering: .relaxed) }

    /// Installs the flag as `db`'s progress handler. The flag must outlive the connection (the
    /// shared database owns both, and closes its connections first).
    func install(on db: Database) {
        let context = Unmanaged.passUnretained(self).toOpaque()
        sqlite3_progress_handler(db.sqliteConnection, Self.checkInterval, { context in
            guard let context else { return 0 }
            return Unmanaged<InterruptionFlag>.fromOpaque(context).takeUnretainedValue().isSet ? 1 : 0
        }, context)
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
