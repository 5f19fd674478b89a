import Baton

/// One commit (or several, coalesced) seen by ``SharedDatabase/commits(table:)``.
public struct DatabaseCommit: Sendable, Hashable {
    /// The commit sequence number after it, counted over every Baton writer of the database;
    /// `nil` for a write made by a program that does not use Baton.
    public var sequence: UInt64?
    /// How many Baton commits this delivery stands for (signals coalesce); 1 for an external one.
    public var count: Int
    /// The last Baton process that committed, when known.
    public var processID: Int32?

    /// Whether a program that does not use Baton made the change.
    public var isExternal: Bool { sequence == nil }

    public init(sequence: UInt64?, count: Int, processID: Int32?) {
        self.sequence = sequence
        self.count = count
        self.processID = processID
    }
}

extension SharedDatabase {
    /// The commits of every process, as they happen: Baton writers' commits that changed rows
    /// (of `table` when given) at once, and external writes (any table) within
    /// ``Configuration/externalChangePollInterval``. Observing starts when this returns.
    /// - Parameter table: Only commits that changed this table (external writes are always
    ///   reported: which table they changed is unknown).
    /// - Returns: An asynchronous sequence; iterate it from one task.
    /// - Throws: `suspended`, or a signal table error.
    public func commits(table: String? = nil) async throws -> DatabaseCommits {
        var watch = try ChangeWatch(database: self, signal: table.map(tableSignal) ?? commitSignal, table: table != nil)
        try await watch.rebaseline()
        return DatabaseCommits(watch: watch)
    }
}

/// The commits of a shared database: see ``SharedDatabase/commits(table:)``.
public struct DatabaseCommits: AsyncSequence, Sendable {
    public typealias Element = DatabaseCommit
    let watch: ChangeWatch

    public func makeAsyncIterator() -> Iterator { Iterator(watch: watch, lastSequence: watch.lastSequence) }

    /// Iterates commits.
    public struct Iterator: AsyncIteratorProtocol {
        var watch: ChangeWatch
        var lastSequence: UInt64

        public mutating func next() async throws -> DatabaseCommit? {
            while true {
                try Task.checkCancellation()
                switch try await watch.nextChange() {
                case .external:
                    return DatabaseCommit(sequence: nil, count: 1, processID: nil)
                case .commit(let sequence):
                    guard sequence > lastSequence else { continue }
                    let count = Int(sequence - lastSequence)
                    lastSequence = sequence
                    return DatabaseCommit(sequence: sequence, count: count, processID: watch.database.writerQueue.lastSequencePID)
                }
            }
        }
    }
}
