import Baton
import GRDB
import Synchronization

/// Rings the database's signals after every commit of this process's writer that wrote to
/// tables: the database's commit signal, and one signal per table written (see
/// ``SharedDatabase/tableSignal(_:)``). The signals' state is the commit sequence number kept
/// in the writer queue's shared page.
///
/// It is added to the writer connection only while some process watches the commits of a single
/// table (``SharedDatabase/commits(table:)``, counted in the writer queue's shared page): a
/// transaction observer costs every statement some of GRDB's bookkeeping. Without it, the writer
/// rings the commit signal itself after each commit that changed rows, and the "some table"
/// signal when a table watcher appeared during the transaction.
///
/// The tables come from GRDB's statement-level question "does this observer care about
/// inserts/updates/deletes in table T?" (asked before each statement runs, from SQLite's
/// authorizer, and by ``Database/notifyChanges(in:)``): the broadcaster notes T and answers no,
/// so GRDB tracks no row events for it (no update hook, no event per row). A statement that
/// matched no row still counts as a write to its table: observers then refresh for nothing,
/// which is harmless; a real change is never missed.
final class CommitBroadcaster: TransactionObserver {
    // Only touched on the writer connection's queue (GRDB calls observers there).
    private var tables: Set<String> = []
    /// Signal names of the tables seen so far (building one costs a lowercasing and a hash).
    private var signalNames: [String: String] = [:]
    private weak let database: SharedDatabase?

    init(database: SharedDatabase) { self.database = database }

    func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool {
        switch eventKind {
        case .insert(let table), .delete(let table), .update(let table, _): tables.insert(table)
        }
        return false
    }

    func databaseDidChange(with event: DatabaseEvent) {}

    func databaseDidCommit(_ db: Database) {
        let changed = tables
        tables = []
        // The relay's notification of other processes' commits changed nothing: announcing it
        // would echo those commits back to every other relay, for ever, and could overwrite the
        // table signal of a commit made meanwhile.
        guard !changed.isEmpty, let database, !database.relaying.isSet else { return }
        var names: [String] = []
        names.reserveCapacity(changed.count)
        for table in changed {
            if let name = signalNames[table] {
                names.append(name)
            } else {
                let name = database.tableSignal(table)
                signalNames[table] = name
                names.append(name)
            }
        }
        database.announceCommit(tableSignals: names)
    }

    func databaseDidRollback(_ db: Database) { tables = [] }
}

extension SharedDatabase {
    /// The signal rung after a commit that changed `table` (state: the commit sequence number).
    public func tableSignal(_ table: String) -> String {
        let plain = commitSignal + ".t." + table.lowercased()
        if plain.utf8.count <= Signals.maxNameBytes, !plain.utf8.contains(0) { return plain }
        return commitSignal + ".h." + Self.identifier(ofPath: table.lowercased())
    }

    /// Rung (besides the commit signal) after a commit whose tables are unknown, when a table
    /// watcher may exist: every table watcher observes it too.
    var anyTableSignal: String { commitSignal + ".any" }

    func announceCommit(tableSignals: [String]) {
        let sequence = writerQueue.bumpSequence()
        localSequence.store(sequence, ordering: .relaxed)
        // A signal is a doorbell: the data is committed already, and observers also poll
        // `data_version`, so a failed post (a full signal table) delays a refresh, loses nothing.
        guard let signals = commitSignals ?? (try? container.signals) else { return }
        for name in tableSignals { try? signals.post(name, state: sequence) }
        try? signals.post(commitSignal, state: sequence)
    }
}
