#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Baton
import GRDB
import Synchronization

extension SharedDatabase {
    /// Feeds the commits of other processes into this process's GRDB observations of ``pool``
    /// (`ValueObservation`, `DatabaseRegionObservation`, GRDBQuery's `@Query`), until the task
    /// is cancelled.
    ///
    /// ```swift
    /// try await withThrowingDiscardingTaskGroup { group in
    ///     group.addTask { try await database.run() }
    ///     for try await players in ValueObservation.tracking(Player.fetchAll).values(in: database.pool) {
    ///         print(players)     // fresh after commits of this process and of every other one
    ///     }
    /// }
    /// ```
    ///
    /// After a Baton writer of another process commits (rung through the database's commit
    /// signal), it calls GRDB's `Database.notifyChanges(in:)` for the tables that commit changed,
    /// so a `DatabaseRegionObservation` of one table is told of that table's commits and not of
    /// the others'. While it runs, every writer of every process tracks which tables it changes
    /// (it counts as a table watcher, like ``commits(table:)``), including writes made through
    /// ``pool`` in this process. Commits whose tables are unknown (a program that does not use
    /// Baton, such as the `sqlite3` shell, noticed through `PRAGMA data_version` within
    /// ``Configuration/externalChangePollInterval``; a commit made as the relay started; a
    /// schema change) are notified as changes to the whole database. So is the start itself,
    /// once: an observation started before `run()` sees the commits made until then. Commits of this process
    /// are left to GRDB, which sees them on its own.
    ///
    /// While the database is suspended nothing is notified; the first change seen after
    /// ``resume()`` is notified as a change to the whole database, so observations catch up. A
    /// relay started while the database is suspended runs too, and notifies from ``resume()`` on.
    /// Observations started before the suspension keep running (with the default
    /// ``SuspensionMode/rollsBackWrites``).
    ///
    /// Run it once per process and database, in a task that lives as long as the observations
    /// (a task group next to your other services, SwiftUI's `.task`).
    /// - Throws: A signal table error (`capacityExceeded`); returns when the task is cancelled.
    public func run() async throws {
        do {
            // (Cancelled while it starts, too: it returns, as it does once running.)
            var relay = try await CommitRelay.start(self)
            try await relay.run()
        } catch is CancellationError {
            return
        }
    }
}

/// The loop of ``SharedDatabase/run()``: waits for commits (``ChangeWatch``), works out which
/// tables changed, and notifies GRDB on the writer connection.
struct CommitRelay {
    let database: SharedDatabase
    let signals: Signals
    var watch: ChangeWatch
    /// The tables of the schema, with the state of their table signal when last seen (the
    /// commit sequence number of the last tracked commit that changed them).
    var tableStates: [String: UInt64] = [:]
    var schemaVersion: Int?
    /// ``TicketLock/untrackedCount`` when last seen.
    var untracked: UInt64
    /// Whether changes were seen while suspended (the next notification is the whole database).
    var missed = false

    /// Reads the schema and the tables' signal states, then starts watching: every commit after
    /// the states were read is either tracked (its tables' states move) or counted as untracked.
    ///
    /// While the database is suspended it starts all the same, without the schema: the first
    /// notification after ``SharedDatabase/resume()`` reads it (and notifies the whole
    /// database). A relay that threw `suspended` here would be gone for good, and with it every
    /// other process's commit for the observations of ``SharedDatabase/pool``.
    static func start(_ database: SharedDatabase) async throws -> CommitRelay {
        let schema: (version: Int, tables: [String])?
        do {
            schema = try await database.writerAccess { db in try Self.schema(db) }
        } catch let error as BatonError where error.code == .suspended {
            schema = nil
        }
        let signals = try database.container.signals
        let untracked = database.writerQueue.untrackedCount
        var states: [String: UInt64] = [:]
        for table in schema?.tables ?? [] { states[table] = (try? signals.state(of: database.tableSignal(table))) ?? 0 }
        // A table watcher from here on: writers that commit after this track their tables (or
        // count their commit as untracked).
        var watch = try ChangeWatch(database: database, signal: database.commitSignal, table: true)
        try await watch.rebaseline()
        // This process's own writes through the pool are announced table by table too (the
        // broadcaster is added to the writer connection while someone watches tables). While
        // suspended, the first notification adds it (see ``notify(_:)``).
        do {
            _ = try await database.writerAccess { db in database.trackTablesIfWatched(db) }
        } catch let error as BatonError where error.code == .suspended {}
        return CommitRelay(database: database, signals: signals, watch: watch, tableStates: states, schemaVersion: schema?.version, untracked: untracked)
    }

    /// The tables whose commits the relay tells apart, and what it notifies.
    struct Notification: Sendable {
        var wholeDatabase: Bool
        var tables: [String]
    }

    mutating func run() async throws {
        let database = self.database
        // Once, as the relay starts: observations started before it may have missed commits
        // made in between (every later commit is watched already, see ``start(_:)``).
        do {
            try await notify(Notification(wholeDatabase: true, tables: []))
        } catch let error as BatonError where error.code == .suspended {
            missed = true
        }
        while true {
            try Task.checkCancellation()
            let change = try await watch.nextChange()
            var notification = Notification(wholeDatabase: missed, tables: [])
            switch change {
            case .external:
                notification.wholeDatabase = true
            case .commit(let sequence):
                let count = database.writerQueue.untrackedCount
                if count != untracked {
                    untracked = count
                    notification.wholeDatabase = true
                }
                let own = database.localSequence.load(ordering: .relaxed)
                for (table, seen) in tableStates {
                    let state = (try? signals.state(of: database.tableSignal(table))) ?? seen
                    guard state != seen else { continue }
                    tableStates[table] = state
                    // This process's own commits reach GRDB without help.
                    if state != own { notification.tables.append(table) }
                }
                if !notification.wholeDatabase, notification.tables.isEmpty, sequence == own {
                    continue
                }
            }
            do {
                try await notify(notification)
                missed = false
            } catch let error as BatonError where error.code == .suspended {
                missed = true
            }
        }
    }

    /// Notifies GRDB's observers of ``SharedDatabase/pool`` in an empty deferred transaction
    /// (which takes no lock); a schema change (or a schema not read yet: a relay started while
    /// suspended) is notified as a change to the whole database.
    private mutating func notify(_ notification: Notification) async throws {
        let known = schemaVersion
        let knownTables = Set(tableStates.keys)
        let database = self.database, signals = self.signals
        let schema = try await database.writerAccess { db -> (version: Int, states: [String: UInt64])? in
            // (Added by start(), unless the database was suspended then; a no-op once added.)
            _ = database.trackTablesIfWatched(db)
            let version = try Int.fetchOne(db, sql: "PRAGMA schema_version") ?? 0
            let changed = version != known
            guard changed || notification.wholeDatabase || !notification.tables.isEmpty else { return nil }
            // The signal states of new tables, read before the notification: a commit after the
            // read moves them (and is relayed later), one before it is covered by it.
            var schema: (version: Int, states: [String: UInt64])?
            if changed {
                let read = try Self.schema(db)
                var states: [String: UInt64] = [:]
                for table in read.tables where !knownTables.contains(table) {
                    states[table] = (try? signals.state(of: database.tableSignal(table))) ?? 0
                }
                schema = (read.version, states)
            }
            database.relaying.set(true)
            defer { database.relaying.set(false) }
            try db.inTransaction(.deferred) {
                if changed || notification.wholeDatabase {
                    try db.notifyChanges(in: .fullDatabase)
                } else {
                    for table in notification.tables { try db.notifyChanges(in: Table(table)) }
                }
                return .commit
            }
            return schema
        }
        if let schema {
            schemaVersion = schema.version
            for (table, state) in schema.states { tableStates[table] = state }
        }
    }

    /// The schema version and the names of the tables (not SQLite's own).
    private static func schema(_ db: Database) throws -> (version: Int, tables: [String]) {
        let version = try Int.fetchOne(db, sql: "PRAGMA schema_version") ?? 0
        let tables = try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        return (version, tables)
    }
}
