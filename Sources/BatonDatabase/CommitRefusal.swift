import Baton
import GRDB
import GRDBSQLite

/// Refuses every commit of the writer connection while the database is suspended: added to the
/// writer connection by ``SharedDatabase/suspend()``, removed by ``SharedDatabase/resume()``.
///
/// `PRAGMA query_only`, which the suspension turns on, stops a write before it takes any lock,
/// but GRDB turns it off again after each read it runs on the writer connection in its
/// read-only mode (`Database.readOnly`, the start of a `ValueObservation` of the pool,
/// `isolated(readOnly:)`): its `endReadOnly()` sets `query_only = 0` whoever had set it. After
/// such a read a short write through the pool (an autocommit `INSERT`, a `PRAGMA user_version`,
/// too short for the progress handler to see it inside its write transaction) committed while
/// the process was suspended.
///
/// The commit is the one step every write goes through, whatever statement or API started it,
/// so that is where the refusal sits: SQLite's commit hook, which GRDB owns and forwards to its
/// transaction observers' `databaseWillCommit()`. When that throws, GRDB makes the commit hook
/// return nonzero, SQLite turns the `COMMIT` (or the autocommit statement's implicit commit)
/// into a rollback, and GRDB throws the observer's error from the statement: here `suspended`.
/// GRDB's read-only toggling cannot bypass it (it runs for every transaction that wrote,
/// read-only mode or not; a transaction in GRDB's read-only mode cannot write, `query_only` is on
/// then). The other candidates fall short: re-asserting `query_only` is undone by GRDB's next
/// read on the writer; an authorizer is consulted when a statement is compiled, not when a
/// cached one (`BEGIN IMMEDIATE`, GRDB's own) runs again, and GRDB owns it too.
///
/// The observer is added only while suspended: a transaction observer costs every statement of
/// the writer connection some of GRDB's bookkeeping. A commit that wrote nothing (an empty
/// deferred transaction, such as ``CommitRelay``'s `notifyChanges(in:)`) holds no lock and is
/// let through. After a refused commit (rolled back, no lock held any more), `query_only` is
/// turned on again, so that the next write fails before it takes a lock.
///
/// A write that slipped in after GRDB's toggling still takes the write lock from its `BEGIN`
/// until its refused commit (or an interrupted statement) ends the transaction; the suspension
/// can bound that, not prevent it (see ``SharedDatabase/suspend()``).
final class CommitRefusal: TransactionObserver, @unchecked Sendable {
    // @unchecked: GRDB calls an observer on the writer connection's queue only; the flag is
    // atomic, the connection pointer is only read (and used there).
    private let interruption: InterruptionFlag
    private let connection: OpaquePointer
    private let path: String

    /// Adds the refusal to `db`, the writer connection.
    init(_ db: Database, interruption: InterruptionFlag, path: String) {
        self.interruption = interruption
        self.connection = db.sqliteConnection!
        self.path = path
    }

    func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool { false }

    func databaseDidChange(with event: DatabaseEvent) {}

    func databaseWillCommit() throws {
        // (SQLITE_TXN_WRITE: the transaction wrote. In the commit hook the transaction is still
        // open; an empty deferred transaction, notified by GRDB without the hook, is not.)
        guard interruption.isSet, sqlite3_txn_state(connection, nil) == SQLITE_TXN_WRITE else { return }
        throw BatonError(.suspended, "cannot commit to \(path) while the process is suspended (the transaction was rolled back); call resume() first")
    }

    func databaseDidCommit(_ db: Database) {}

    func databaseDidRollback(_ db: Database) {
        // Still suspended: refuse the next write before it takes a lock (GRDB notifies rollbacks
        // outside its read-only mode only, so this does not fight a read of GRDB's).
        if interruption.isSet { _ = try? db.execute(sql: "PRAGMA query_only = 1") }
    }
}
