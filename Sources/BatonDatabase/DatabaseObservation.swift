import Baton
import GRDB

extension SharedDatabase {
    /// Fresh values of `value`: the current one first, then a new one after every commit of any
    /// process, including writes made by programs that do not use Baton (noticed within
    /// ``Configuration/externalChangePollInterval``).
    ///
    /// ```swift
    /// for try await count in database.observe({ db in try Message.fetchCount(db) }) { ... }
    /// ```
    ///
    /// Values may repeat (a commit to another table). While the database is suspended no value
    /// is fetched; the next one comes after ``resume()``.
    /// - Parameter value: Runs on a reader connection for every fresh value.
    /// - Returns: An asynchronous sequence; iterate it from one task.
    public func observe<T: Sendable>(_ value: @escaping @Sendable (Database) throws -> T) -> DatabaseObservation<T> {
        DatabaseObservation(database: self, value: value)
    }
}

/// The fresh values of an observation of a ``SharedDatabase``: see
/// ``SharedDatabase/observe(_:)``.
public struct DatabaseObservation<Element: Sendable>: AsyncSequence, Sendable {
    let database: SharedDatabase
    let value: @Sendable (Database) throws -> Element

    public func makeAsyncIterator() -> Iterator { Iterator(database: database, value: value) }

    /// Iterates fresh values. Throws what the value closure throws, or a database error.
    public struct Iterator: AsyncIteratorProtocol {
        let database: SharedDatabase
        let value: @Sendable (Database) throws -> Element
        var watch: ChangeWatch?

        public mutating func next() async throws -> Element? {
            if watch == nil {
                // Observe before the first fetch: no commit after it can be missed.
                watch = try ChangeWatch(database: database, signal: database.commitSignal)
                // Take the data_version baseline before reading, so a change in between is seen.
                try await watch?.rebaseline()
                if let first = try fetch() { return first }
            }
            while true {
                try Task.checkCancellation()
                guard var current = watch else { return nil }
                // (nextChange takes the next baseline as it returns, before this fetch.)
                _ = try await current.nextChange()
                watch = current
                if let fresh = try fetch() { return fresh }
            }
        }

        /// The value, or `nil` while the database is suspended. Read on the calling thread (a
        /// reader connection does not wait behind writes), as is the `data_version` baseline
        /// taken just before it (on a connection of its own, see
        /// ``SharedDatabase/dataVersion()``): a fresh value costs no thread hop after the
        /// wake-up (run the iteration on `container.signals.executor` and it costs none at all),
        /// and neither waits for the app's writes through the pool.
        private func fetch() throws -> Element? {
            do {
                return try database.readNow(value)
            } catch let error as BatonError where error.code == .suspended {
                return nil
            }
        }
    }
}

/// Waits for the next change to a shared database: a delivery of a Baton commit signal, or a
/// change of `PRAGMA data_version` found by polling (a writer that does not use Baton).
struct ChangeWatch: Sendable {
    let database: SharedDatabase
    let signals: SignalObservation
    /// For the commits of one table: the "some table" signal, rung after commits whose tables
    /// the writer did not track (see ``CommitBroadcaster``).
    let anyTable: SignalObservation?
    /// Keeps this process counted as a table watcher while the watch lives.
    let watcher: TableWatcher?
    var baseline: SharedDatabase.DataVersion?
    var lastSequence: UInt64

    /// Watches `signal`; with `table`, as a table watcher (counted before observing, so every
    /// writer that commits after this returns either tracks its tables or rings "some table").
    init(database: SharedDatabase, signal: String, table: Bool = false) throws {
        self.database = database
        self.watcher = table ? TableWatcher(database.writerQueue) : nil
        self.signals = try database.container.signals.observe(signal)
        self.anyTable = table ? try database.container.signals.observe(database.anyTableSignal) : nil
        self.lastSequence = database.writerQueue.sequence
    }

    /// Counts a process as a table watcher in the writer queue's shared page while it lives.
    final class TableWatcher: Sendable {
        let queue: TicketLock
        init(_ queue: TicketLock) {
            self.queue = queue
            queue.addWatcher()
        }
        deinit { queue.removeWatcher() }
    }

    /// The next signal delivery (of either observation), or throws `timedOut` at the deadline.
    nonisolated(nonsending) private func nextDelivery(deadline: Deadline) async throws -> SignalDelivery {
        guard let anyTable else { return try await signals.next(deadline: deadline) }
        return try await SignalObservation.next(from: [signals, anyTable], deadline: deadline)
    }

    /// What changed.
    enum Change {
        /// A Baton writer committed; `sequence` is the commit sequence number after it.
        case commit(sequence: UInt64)
        /// A connection that does not use Baton committed.
        case external
    }

    /// How long a data_version change waits for a Baton writer's signal before it counts as a
    /// commit by another program.
    static let announceGrace: Duration = .milliseconds(50)

    /// How long a data_version change waits in all for a Baton writer's signal while a live
    /// process holds the writer queue's turn.
    static let announceLimit: Duration = .seconds(2)

    nonisolated(nonsending) mutating func rebaseline() async throws {
        baseline = try? await database.dataVersion()
    }

    nonisolated(nonsending) mutating func nextChange() async throws -> Change {
        while true {
            do {
                let delivery = try await nextDelivery(deadline: .after(database.configuration.externalChangePollInterval))
                lastSequence = max(lastSequence, delivery.state)
                baseline = try? await database.dataVersion()
                return .commit(sequence: delivery.state)
            } catch let error as BatonError where error.code == .timedOut {
                guard let version = try? await database.dataVersion() else { continue }
                defer { baseline = version }
                guard let baseline, baseline != version else {
                    if baseline == nil { return .external }  // first check after a resume
                    continue
                }
                // data_version moved: a Baton commit (its signal is on its way) or another program
                // (or this process's write through the pool with no table watcher: it rings no
                // signal, and the data_version connection sees it as any other connection does).
                let sequence = database.writerQueue.sequence
                if sequence != lastSequence {
                    lastSequence = sequence
                    return .commit(sequence: sequence)
                }
                // A Baton writer bumps the sequence just after its COMMIT, still holding the
                // writer queue's turn: give its signal time before calling this a change by
                // another program (which would notify the whole database for one table's
                // commit). One grace period, then more while a live process holds the turn (a
                // writer descheduled between its COMMIT and its signal, as on a loaded
                // machine), up to ``announceLimit``. A program that does not use Baton does not
                // take the turn, so its commits are still reported after one grace period
                // unless a Baton writer holds the turn meanwhile.
                let waitStarted = ContinuousClock.now
                while true {
                    do {
                        let delivery = try await nextDelivery(deadline: .after(Self.announceGrace))
                        lastSequence = max(lastSequence, delivery.state)
                        return .commit(sequence: delivery.state)
                    } catch let error as BatonError where error.code == .timedOut {
                        // No signal within this grace period.
                    }
                    let settled = database.writerQueue.sequence
                    if settled != lastSequence {
                        lastSequence = settled
                        return .commit(sequence: settled)
                    }
                    guard database.writerQueue.holder != nil, ContinuousClock.now - waitStarted < Self.announceLimit else {
                        return .external
                    }
                }
            }
        }
    }
}
