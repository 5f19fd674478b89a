import GRDB
import GRDBSQLite
import Synchronization

/// A read-only SQLite connection of its own that reads `PRAGMA data_version` for
/// ``SharedDatabase/dataVersion()``, on the calling thread.
///
/// Nothing else uses it, so a read never waits for GRDB's writer connection (the app may hold
/// it for a long write through ``SharedDatabase/pool``), and in WAL mode a reader never waits
/// for a writer: one read is a few microseconds on the caller's thread, with no thread hop.
///
/// SQLite's rule (`PRAGMA data_version`): the value of a connection changes when another
/// connection commits, this process's writer connection included, and stays the same for the
/// connection's own commits (this one makes none). Values of two connections cannot be compared,
/// so each value carries ``identity``, new for every connection opened.
///
/// It never holds a read transaction between two reads: the statement is reset as soon as its
/// row is read (a reset statement ends the read transaction that `data_version` needs), so, idle,
/// it holds what an idle WAL reader holds (a shared lock on the database and its `-shm`), which
/// Apple's rule for suspended processes allows. ``SharedDatabase`` closes it with its pool
/// (``SharedDatabase/SuspensionMode/closesConnections``) and makes a new one after.
///
/// It uses the SQLite library GRDB uses (GRDBSQLite): POSIX locks belong to the process, and
/// only one library's bookkeeping of the files' locks keeps a close of one connection from
/// releasing the locks of another.
final class DataVersionReader: Sendable {
    /// Distinguishes this connection's values from every other connection's.
    let identity: UInt64

    private struct Connection {
        let handle: OpaquePointer
        /// `PRAGMA data_version`, prepared once for the connection's life.
        let statement: OpaquePointer
    }

    /// `nil` once closed. `SQLITE_OPEN_NOMUTEX`: the mutex serializes the uses.
    private let connection: Mutex<Connection?>

    private static let identities = Atomic<UInt64>(0)

    /// Opens the connection read-only and prepares the statement (which reads the schema: a
    /// file that this connection cannot read, such as an encrypted database that needs a key
    /// the app's `prepareDatabase` gives GRDB's connections, fails here).
    init(path: String) throws {
        var handle: OpaquePointer?
        let code = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nil)
        guard code == SQLITE_OK, let handle else {
            let error = Self.error(handle, code, "open")
            // (SQLite allocates a handle even when opening fails.)
            sqlite3_close_v2(handle)
            throw error
        }
        sqlite3_extended_result_codes(handle, 1)
        var statement: OpaquePointer?
        let prepared = sqlite3_prepare_v3(handle, "PRAGMA data_version", -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard prepared == SQLITE_OK, let statement else {
            let error = Self.error(handle, prepared, "prepare PRAGMA data_version")
            sqlite3_finalize(statement)
            sqlite3_close_v2(handle)
            throw error
        }
        identity = Self.identities.add(1, ordering: .relaxed).newValue
        connection = Mutex(Connection(handle: handle, statement: statement))
    }

    deinit { close() }

    /// `PRAGMA data_version` now. Throws a `DatabaseError` (`SQLITE_BUSY` while another
    /// connection recovers the WAL, `SQLITE_MISUSE` once closed).
    func read() throws -> Int {
        try connection.withLock { connection throws -> Int in
            guard let connection else {
                throw DatabaseError(resultCode: .SQLITE_MISUSE, message: "the data_version connection is closed")
            }
            // Reset at once, error or not: the read transaction ends with the statement.
            defer { sqlite3_reset(connection.statement) }
            let code = sqlite3_step(connection.statement)
            guard code == SQLITE_ROW else { throw Self.error(connection.handle, code, "read PRAGMA data_version") }
            return Int(sqlite3_column_int64(connection.statement, 0))
        }
    }

    /// Whether the connection is in a read (or any) transaction now: never between two
    /// ``read()``s (for tests).
    var isInTransaction: Bool {
        connection.withLock { connection in
            guard let connection else { return false }
            return sqlite3_txn_state(connection.handle, nil) != SQLITE_TXN_NONE || sqlite3_stmt_busy(connection.statement) != 0
        }
    }

    /// Finalizes the statement and closes the connection; later reads throw `SQLITE_MISUSE`.
    func close() {
        connection.withLock { connection in
            guard let open = connection else { return }
            connection = nil
            sqlite3_finalize(open.statement)
            sqlite3_close_v2(open.handle)
        }
    }

    private static func error(_ handle: OpaquePointer?, _ code: Int32, _ doing: String) -> DatabaseError {
        // (The connection's own code when it is about this failure: it tells SQLITE_BUSY_RECOVERY
        // from SQLITE_BUSY.)
        let own = handle.map { sqlite3_extended_errcode($0) } ?? code
        let extended = own & 0xFF == code & 0xFF ? own : code
        let message = handle.flatMap { sqlite3_errmsg($0) }.map { String(cString: $0) } ?? "SQLite error \(code)"
        return DatabaseError(resultCode: ResultCode(rawValue: extended), message: "\(doing): \(message)")
    }
}
