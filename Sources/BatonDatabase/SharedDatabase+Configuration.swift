import GRDB

extension SharedDatabase {
    /// Settings of a ``SharedDatabase``. The defaults are the ones that are right for sharing.
    public struct Configuration: Sendable {
        /// How long a write waits for its turn (in the fair writer queue, then for SQLite's write
        /// lock) before it fails with `busy`. Default 5 s.
        public var busyTimeout: Duration = .seconds(5)
        /// How often observers check `PRAGMA data_version` for writes made by programs that do not
        /// use Baton (Baton's own writers ring a signal, noticed at once). Default 1 s.
        public var externalChangePollInterval: Duration = .seconds(1)
        /// How long ``SharedDatabase/open(at:container:migrator:configuration:)`` waits for
        /// another process that is opening or migrating the database. Default 30 s.
        public var openTimeout: Duration = .seconds(30)
        /// WAL pages after which a writer checkpoints. It hands its turn in the writer queue on
        /// first, so the writers of other processes commit while it waits for the disk (this
        /// replaces SQLite's automatic checkpoint, `PRAGMA wal_autocheckpoint`, which would run
        /// inside `COMMIT`). Default 1000.
        public var checkpointPages: Int = 1000
        /// The size the WAL file is truncated to when it starts over after growing past it
        /// (`PRAGMA journal_size_limit`), which keeps it bounded after a large transaction. Keep it
        /// above the WAL's usual peak, 3 × ``checkpointPages`` pages (see
        /// ``SharedDatabase`` on checkpoints): truncating the WAL every time only to grow it again
        /// costs writers about 5 %. Default 12 MiB.
        public var journalSizeLimit: Int = 12 << 20
        /// When the WAL file grows past this size (readers that come and go can keep SQLite's
        /// automatic checkpoints from ever restarting it), a writer runs a `RESTART` checkpoint
        /// after its commit: it waits (up to 50 ms, while the other writers wait) for readers of
        /// old snapshots to finish, so the next commit starts the WAL over. Default 16 MiB.
        public var walRestartSize: Int = 16 << 20
        /// Reader connections of this process. Default 5.
        public var maximumReaderCount: Int = 5
        /// Accept a database file (or `-wal`, `-shm`) that another user owns or that group or
        /// others may write. Off by default: such a user could replace the database and forge
        /// what this process reads. A container opened with
        /// ``SharedContainer/Options/trustsOtherUsers`` implies it.
        public var trustsOtherUsers = false
        /// What ``SharedDatabase/suspend()`` releases. Default
        /// ``SharedDatabase/SuspensionMode/rollsBackWrites``: the pool stays open.
        public var suspensionMode: SuspensionMode = .rollsBackWrites
        /// Runs on every new connection, after Baton's own settings (for `PRAGMA`s, functions).
        public var prepareDatabase: (@Sendable (Database) throws -> Void)?

        /// The defaults.
        public init() {}
    }
}

extension SharedDatabase {
    /// What a suspension of a shared database releases (see ``SharedDatabase/suspend()``).
    public struct SuspensionMode: Sendable, Hashable, CustomStringConvertible {
        private let name: String

        /// Interrupts and rolls back writes and refuses new ones until resume; the connections
        /// stay open, so ``SharedDatabase/pool`` stays the same object and its observations keep
        /// running. Idle WAL reader connections keep their shared lock on the `-shm` file, which
        /// Apple's rule for suspended processes allows (TN2408: a process using a WAL database is
        /// killed only if it holds a write transaction open when suspended). The default.
        public static let rollsBackWrites = SuspensionMode(name: "rollsBackWrites")

        /// Interrupts every statement and closes every connection: the process holds no lock on
        /// the database's files at all while suspended (the strictest reading of Apple's rule).
        /// ``SharedDatabase/resume()`` opens a new pool, so ``SharedDatabase/pool`` changes and
        /// observations of the old pool end with an error.
        public static let closesConnections = SuspensionMode(name: "closesConnections")

        public var description: String { name }
    }
}
