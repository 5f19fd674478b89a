#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Baton
import CBatonShims
import GRDB
import GRDBSQLite
import Synchronization

/// One SQLite database (GRDB, WAL mode) shared by the processes of a ``SharedContainer``.
///
/// ```swift
/// let database = try await SharedDatabase.open(at: groupPath + "/app.sqlite", container: container, migrator: migrator)
/// try await database.write { db in try db.execute(sql: "INSERT INTO message(text) VALUES (?)", arguments: ["hi"]) }
/// for try await count in database.observe({ db in try Int.fetchOne(db, sql: "SELECT count(*) FROM message") ?? 0 }) {
///     print(count)    // fresh after every commit of any process, including the `sqlite3` shell
/// }
/// ```
///
/// What it adds to a plain `DatabasePool`:
/// - opening and migrating happen under an exclusive cross-process lock, so processes that
///   open a new database at the same instant create the schema once;
/// - writers of every process are served first come, first served (a ``TicketLock`` taken before
///   `BEGIN IMMEDIATE`): SQLite's busy handler alone lets one writer starve another;
/// - every commit that changes rows rings a signal, so ``observe(_:)`` and ``commits(table:)`` in
///   other processes see it at once; writes by programs that do not use Baton are noticed
///   through `PRAGMA data_version`;
/// - ``suspend()`` interrupts the write that runs, rolls it back and refuses new writes, so the
///   process holds no write lock while suspended (iOS kills a suspended process that holds one
///   on a WAL database: 0xDEAD10CC); with ``SuspensionMode/closesConnections`` it closes every
///   connection too;
/// - ``write(fencedBy:_:)`` refuses a write made under a stale lease.
///
/// Your own GRDB code uses ``pool``: the same `DatabasePool` for the life of the shared
/// database (unless it was opened with ``SuspensionMode/closesConnections``). Run ``run()`` in a
/// task to feed other processes' commits into its `ValueObservation`s and
/// `DatabaseRegionObservation`s. Never keep the `Database` passed to a closure beyond the
/// closure.
public final class SharedDatabase: Sendable {
    /// The database file's absolute path.
    public let path: String
    /// The container whose processes share the database.
    public let container: SharedContainer
    /// The settings it was opened with.
    public let configuration: Configuration
    /// Whether it was opened with ``openReadOnly(at:container:migrator:configuration:)``.
    public let isReadOnly: Bool

    /// A stable id of the database file (hash of its absolute path), used in signal and lock names.
    public let identifier: String
    /// The signal rung after every commit that changes rows (state: the commit sequence number).
    public let commitSignal: String

    let writerQueue: TicketLock
    /// This process's turn in the writer queue, kept between writes (see
    /// ``TicketLock/keep(_:)``): with several writer processes the queue changes hands once per
    /// quantum instead of once per commit.
    private let keptTurn = Mutex<TicketLock.Ticket?>(nil)
    /// The commit broadcaster and the writer connection it is added to (see
    /// ``CommitBroadcaster``); only used on the writer connection.
    private struct Broadcasting {
        var observer: CommitBroadcaster?
        /// Whether it is added to the writer connection of the current pool (reset by
        /// `makePool`: a new pool has a new writer connection).
        var installed = false
    }
    private let broadcasting = Mutex(Broadcasting())
    /// `broadcasting.installed`, readable without the lock (checked before every write).
    private let broadcastingInstalled = Atomic<Bool>(false)
    /// The container's signals, for ringing commits (resolved once: every commit rings).
    let commitSignals: Signals?
    /// Set while suspended: interrupts the statements of the writer connection's write
    /// transactions (a progress handler) and stops Baton's own waits. Reads on the writer
    /// connection go on: GRDB fetches observed values there (see ``InterruptionFlag``).
    let interruption = InterruptionFlag()
    /// Set while suspended with ``SuspensionMode/closesConnections``: interrupts every statement
    /// of every connection.
    let readInterruption = InterruptionFlag()
    /// Set while a write of this process holds its turn in the writer queue (see ``BusyWait``).
    let holdingTurn = InterruptionFlag()
    /// The commit sequence number of this process's last announced commit (see ``run()``).
    let localSequence = Atomic<UInt64>(0)
    /// Set while ``run()`` notifies GRDB of other processes' commits, in an empty transaction on
    /// the writer connection: that transaction is not a commit to announce (see
    /// ``CommitBroadcaster``). Only touched on the writer connection's queue.
    let relaying = InterruptionFlag()
    /// Writer-connection accesses of this process in flight (writes, the relay's notifications,
    /// data_version checks when their own connection cannot be used): the fast path runs only
    /// when there are none, so GRDB's writer queue is idle.
    let writerAccesses = Atomic<Int>(0)
    /// Commits of this process while its WAL is past the size bound (a `RESTART` is tried every
    /// 32nd).
    private let localCommits = Atomic<Int>(0)
    /// Set while SQLite's locks are to be tried once, not waited for (the fast path's `BEGIN`, a
    /// checkpoint's opportunistic restart).
    let tryOnce = InterruptionFlag()
    /// Schedules the WAL checkpoints of this process's writer (see ``Checkpointer``).
    let checkpointer: Checkpointer
    /// Runs the `PASSIVE` checkpoints this process's writers claim, outside their calls.
    let checkpointThread: CheckpointThread
    /// Set while a writer runs a `RESTART` checkpoint: SQLite's lock waits are kept short.
    let checkpointing = InterruptionFlag()
    private let state = Mutex(State())

    private struct State {
        /// Set by `open`; replaced only after a suspension that closed it.
        var pool: DatabasePool?
        /// Whether `pool` was closed by a suspension (``SuspensionMode/closesConnections``).
        var poolClosed = false
        /// The connection that reads `PRAGMA data_version` (see ``dataVersion()``): made on
        /// first use, closed with `pool`, made again for the next one.
        var versionReader = VersionReaderSlot.unopened
        /// Nested suspensions (ours and the container's).
        var depth = 0
        /// Operations (reads and writes) running now.
        var active = 0
        /// The refusal of commits added to the writer connection by the current suspension,
        /// with its `query_only` (``SuspensionMode/rollsBackWrites``).
        var commitRefusal: CommitRefusal?
        /// Whether the current suspension has finished releasing the database.
        var closed = false
        /// Suspenders waiting for the first one to finish releasing.
        var suspenders: [CheckedContinuation<Void, Never>] = []
        /// The first suspender, waiting for the running operations to return.
        var drainers: [CheckedContinuation<Void, Never>] = []
        var registration: SuspensionController.RegistrationToken?
    }

    enum VersionReaderSlot {
        case unopened
        case open(DataVersionReader)
        /// It could not be opened: ``dataVersion()`` uses the writer connection until `pool` is
        /// opened again.
        case unavailable

        /// Closes an open reader; the next pool gets a new one.
        mutating func close() {
            if case .open(let reader) = self { reader.close() }
            self = .unopened
        }
    }

    private init(path: String, container: SharedContainer, configuration: Configuration, readOnly: Bool) throws {
        self.path = path
        self.container = container
        self.configuration = configuration
        self.isReadOnly = readOnly
        self.identifier = Self.identifier(ofPath: path)
        self.commitSignal = "baton.db.\(identifier)"
        self.writerQueue = try TicketLock(container, name: "database/\(identifier).queue")
        self.checkpointer = Checkpointer(pages: configuration.checkpointPages, queue: writerQueue)
        self.checkpointThread = CheckpointThread(path: path, checkpointer: checkpointer)
        self.commitSignals = try? container.signals
        let diagnostics = container.diagnostics
        checkpointThread.attach(.init(
            begin: { [weak self] in self?.beginBackgroundOperation() ?? false },
            end: { [weak self] in self?.leave() },
            report: { reason in
                diagnostics.report(.checkpointsInWriterCalls, level: .warning, "database \(path): the checkpoint thread cannot work on it (\(reason)); its checkpoints run in the writers' calls, which then wait for the disk's sync")
            }))
    }

    deinit {
        checkpointThread.stop()
        releaseKeptTurn()
        let (pool, token) = state.withLock { state in
            state.versionReader.close()
            return (state.pool, state.registration)
        }
        if let token { container.suspension.unregister(token) }
        try? pool?.close()
    }

    // MARK: - Opening

    /// Opens (creating it if needed) and migrates a shared database.
    ///
    /// Opening and migrating run under an exclusive lock of the container (and, on Apple
    /// platforms, inside `NSFileCoordinator`), so several processes may call this at the same
    /// instant: every one succeeds and the migrations run once.
    ///
    /// - Parameters:
    ///   - path: The database file. Its directory must exist.
    ///   - container: The container of the processes that share it.
    ///   - migrator: The schema. A database whose schema is newer than `migrator` knows is refused.
    ///   - configuration: Timeouts and SQLite settings.
    /// - Returns: The open database.
    /// - Throws: `suspended` while the container is suspended; `timedOut` if the open lock stays
    ///   held past ``Configuration/openTimeout``; `notADatabase` or `corrupt` for a file that is
    ///   not a sound SQLite database; `invalidArgument` when the database is newer than `migrator`;
    ///   `notARegularFile`, `ownedByAnotherUser` or `writableByOthers` for the database file or
    ///   its `-wal` or `-shm` (see ``Configuration/trustsOtherUsers``). A new database file is
    ///   created with mode 0600, and SQLite gives its `-wal` and `-shm` the same mode.
    public static func open(
        at path: String,
        container: SharedContainer,
        migrator: DatabaseMigrator,
        configuration: Configuration = Configuration()
    ) async throws -> SharedDatabase {
        try container.suspension.checkActive("open the shared database \(path)")
        let database = try SharedDatabase(path: try absolutePath(path), container: container, configuration: configuration, readOnly: false)
        let lock = try FileLock(container, name: "database/\(database.identifier).open.lock")
        let held = try await lock.lock(.exclusive, deadline: .after(configuration.openTimeout))
        defer { held.release() }
        try FileCoordination.coordinate(writingItemAt: database.path) {
            let pool = try database.makePool()
            do {
                try migrator.migrate(pool)
                if try pool.read(migrator.hasBeenSuperseded) {
                    throw BatonError(.invalidArgument, "the database \(database.path) has migrations this program does not know: it was written by a newer version. Update this program")
                }
            } catch {
                try? pool.close()
                throw database.translate(error)
            }
            database.state.withLock { $0.pool = pool }
        }
        database.register()
        return database
    }

    /// Opens a shared database for reading only, without ever writing to it.
    ///
    /// Works while no writer runs: writers keep the `-wal` and `-shm` files (persistent WAL).
    ///
    /// - Parameters:
    ///   - path: The database file.
    ///   - container: The container of the processes that share it.
    ///   - migrator: When given, the database is returned only once every migration it knows
    ///     has been applied (and not when the database is newer).
    ///   - configuration: Timeouts and SQLite settings.
    /// - Returns: The database, or `nil` while the file does not exist or its migrations are not
    ///   complete.
    /// - Throws: `suspended`, `notADatabase`, `corrupt`, or a `DatabaseError`.
    public static func openReadOnly(
        at path: String,
        container: SharedContainer,
        migrator: DatabaseMigrator? = nil,
        configuration: Configuration = Configuration()
    ) async throws -> SharedDatabase? {
        try container.suspension.checkActive("open the shared database \(path)")
        let database = try SharedDatabase(path: try absolutePath(path), container: container, configuration: configuration, readOnly: true)
        let ready = try FileCoordination.coordinate(readingItemAt: database.path) { () throws -> Bool in
            guard FileManager.default.fileExists(atPath: database.path) else { return false }
            let pool: DatabasePool
            do {
                pool = try database.makePool()
            } catch {
                if !FileManager.default.fileExists(atPath: database.path) { return false }
                throw error
            }
            do {
                if let migrator {
                    let complete = try pool.read { db in
                        try migrator.hasCompletedMigrations(db) && !migrator.hasBeenSuperseded(db)
                    }
                    guard complete else {
                        try? pool.close()
                        return false
                    }
                } else {
                    // Fail now, not on first use, for a file that is not a database.
                    _ = try pool.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM sqlite_master") }
                }
            } catch {
                try? pool.close()
                throw database.translate(error)
            }
            database.state.withLock { $0.pool = pool }
            return true
        }
        guard ready else { return nil }
        database.register()
        return database
    }

    private func register() {
        let token = container.suspension.register(SuspensionHook(self))
        state.withLock { $0.registration = token }
    }

    /// Opens a `DatabasePool` with the sharing settings (after ``checkFiles(at:create:trustsOtherUsers:)``).
    func makePool() throws -> DatabasePool {
        try Self.checkFiles(at: path, create: !isReadOnly,
                            trustsOtherUsers: configuration.trustsOtherUsers || container.options.trustsOtherUsers)
        var grdb = GRDB.Configuration()
        grdb.readonly = isReadOnly
        let busyWait = BusyWait(
            timeout: configuration.busyTimeout, interruption: interruption, tryOnce: tryOnce,
            checkpointing: checkpointing, holdingTurn: holdingTurn, queue: writerQueue)
        grdb.busyMode = .callback(busyWait.shouldRetry)
        // (The try-once flag also reaches readers, which in WAL mode meet a busy lock only
        // during WAL recovery; one that does in that microsecond window fails with `busy`.)
        grdb.maximumReaderCount = configuration.maximumReaderCount
        grdb.label = "BatonDatabase"
        // Baton suspends this pool by itself (see suspend()); an app that also follows GRDB's
        // guide and posts `Database.suspendNotification` suspends it GRDB's way as well.
        grdb.observesSuspensionNotifications = configuration.suspensionMode == .rollsBackWrites
        let settings = configuration
        let flag = interruption, readFlag = readInterruption
        let checkpointer = checkpointer
        grdb.prepareDatabase { db in
            // Readers stop while the suspension closes connections; the writer connection's
            // write transactions stop while the database is suspended (its reads go on unless
            // connections are closed).
            if db.configuration.readonly { readFlag.install(on: db) } else { flag.installOnWriter(db, all: readFlag) }
            if !db.configuration.readonly {
                try SQLiteSettings.persistWAL(db)
                try db.execute(sql: "PRAGMA synchronous = NORMAL")
                try db.execute(sql: "PRAGMA journal_size_limit = \(settings.journalSizeLimit)")
            }
            try settings.prepareDatabase?(db)
            // Last: Baton checkpoints, not SQLite's automatic checkpoint in COMMIT.
            if !db.configuration.readonly { checkpointer.install(on: db) }
        }
        let pool: DatabasePool
        broadcasting.withLock { $0.installed = false }
        broadcastingInstalled.store(false, ordering: .relaxed)
        do {
            pool = try DatabasePool(path: path, configuration: grdb)
        } catch {
            throw translate(error)
        }
        return pool
    }

    // MARK: - Reading and writing

    /// Reads from a consistent snapshot of the database.
    /// - Parameter body: Runs on a reader connection; do not keep `db`.
    /// - Returns: What `body` returns.
    /// - Throws: `suspended` while suspended (a running read is interrupted), what `body` throws.
    public func read<T: Sendable>(_ body: @Sendable (Database) throws -> T) async throws -> T {
        let pool = try enter(writing: false)
        defer { leave() }
        do {
            return try await pool.read(body)
        } catch {
            throw translate(error)
        }
    }

    /// Writes in one `IMMEDIATE` transaction, after the writers of every process that asked
    /// before (fair queue). Commits when `body` returns, rolls back when it throws.
    ///
    /// When no writer of any process is queued, `body` runs on the calling thread, which saves a
    /// thread hop per write (a quarter of a one-row commit's time). A long transaction then holds
    /// that thread of Swift's cooperative pool until it commits, as a synchronous GRDB write
    /// does: start bulk work from a task that may block a thread for that long. Likewise, a
    /// write of your own through ``pool`` that holds GRDB's writer connection at that moment
    /// (Baton cannot see it coming: GRDB offers no way to ask whether its writer is busy) makes
    /// the calling thread wait for it, as a second synchronous GRDB write would.
    /// - Parameter body: Runs on the writer connection inside the transaction.
    /// - Returns: What `body` returns.
    /// - Throws: `busy` when the write lock could not be had within
    ///   ``Configuration/busyTimeout`` (naming the holder when known); `suspended`; `notWritable`
    ///   for a read-only database; `CancellationError`; what `body` throws.
    @inlinable
    public func write<T: Sendable>(_ body: @Sendable (Database) throws -> T) async throws -> T {
        try await writeResult(fence: nil, body)
    }

    /// Writes like ``write(_:)``, but only if `fence` is still current: in the same transaction
    /// the fence's epoch is compared with the highest epoch this database has seen for its
    /// scope (kept in the table `baton_fence`) and the fence is validated. A stale fence writes
    /// nothing.
    /// - Parameters:
    ///   - fence: The lease (or other fencing token) the write is made under.
    ///   - body: Runs on the writer connection inside the transaction.
    /// - Returns: What `body` returns.
    /// - Throws: `fenced` (its cause is a ``FenceConflict`` with the current epoch), and what
    ///   ``write(_:)`` throws.
    @inlinable
    public func write<T: Sendable>(fencedBy fence: some Fence, _ body: @Sendable (Database) throws -> T) async throws -> T {
        try await writeResult(fence: fence, body)
    }

    /// Passes `body`'s result through a local, in the caller's specialized code, so that the
    /// write path itself is not generic (unspecialized generic code pays for type metadata and
    /// witness calls on every write).
    @inlinable
    func writeResult<T: Sendable>(fence: (any Fence)?, _ body: @Sendable (Database) throws -> T) async throws -> T {
        nonisolated(unsafe) var result: T?
        try await performWrite(fence: fence) { db in result = try body(db) }
        return result!
    }

    /// The write path of ``write(_:)`` and ``write(fencedBy:_:)``: `body` has run, in a
    /// committed transaction, when this returns.
    @usableFromInline
    func performWrite(fence: (any Fence)?, _ body: @Sendable (Database) throws -> Void) async throws {
        let pool = try enter(writing: true)
        defer { leave() }
        switch try fastWrite(pool, fence: fence, body) {
        case .written(nil):
            return
        case .written(let wait?):
            // Still counted as this process's writer (as in the queued path, where this wait
            // holds GRDB's writer queue): the next local write goes the queued way meanwhile.
            defer { writerAccesses.subtract(1, ordering: .releasing) }
            await checkpointer.wait(for: wait, on: checkpointThread)
            return
        case .notTaken:
            break
        }
        writerAccesses.add(1, ordering: .acquiringAndReleasing)
        defer { writerAccesses.subtract(1, ordering: .releasing) }
        try await queuedWrite(pool, fence: fence, body)
    }

    /// What ``fastWrite(_:fence:_:)`` did.
    private enum FastWrite {
        /// Nothing: the queued path must be taken.
        case notTaken
        /// The write is committed. With a wait (for this process's checkpoint thread), the
        /// caller makes it, suspended, and then gives up its count in `writerAccesses`.
        case written(Checkpointer.AfterTurnWait?)
    }

    /// The fast path: when no writer of any process holds or waits for the writer queue and
    /// this process's writer connection is idle, write on the calling thread. It cannot block
    /// for long: the queue is free, and SQLite's lock is tried once. A wait for this process's
    /// checkpoint thread that the commit calls for is left to the caller, which makes it
    /// suspended: on this thread, a task's, it would hold a thread of Swift's cooperative pool
    /// up to `busyTimeout` behind a checkpoint a slow disk holds, and with it every task that
    /// pool would run (a test's 500 ms sleep resumed after 30 s, the test's `busyTimeout`, in
    /// full test runs on a loaded 2-core machine). Returns ``FastWrite/notTaken`` when the queued
    /// path must be taken (someone is queued, or a connection that does not use Baton holds
    /// SQLite's lock).
    private func fastWrite(_ pool: DatabasePool, fence: (any Fence)?, _ body: (Database) throws -> Void) throws -> FastWrite {
        guard writerAccesses.compareExchange(expected: 0, desired: 1, ordering: .acquiringAndReleasing).exchanged else {
            return .notTaken
        }
        var keepsAccess = false
        defer { if !keepsAccess { writerAccesses.subtract(1, ordering: .releasing) } }
        guard let ticket = resumeKeptTurn() ?? writerQueue.tryAcquire() else { return .notTaken }
        do {
            // GRDB's synchronous access runs on this thread when the writer queue is idle.
            let (done, wait) = try pool.writeWithoutTransaction { db -> (Bool, Checkpointer.AfterTurnWait?) in
                var plan = Checkpointer.Plan.none
                let done = try self.immediateTransaction(db, ticket: ticket, fence: fence, plan: &plan, body)
                return (done, self.checkpointer.handOff(plan, on: db, thread: self.checkpointThread, patience: self.configuration.busyTimeout))
            }
            guard done else { return .notTaken }
            keepsAccess = wait != nil
            return .written(wait)
        } catch {
            throw translate(error)
        }
    }

    /// The fast path's transaction, on the calling thread, holding `ticket`. Returns `false`
    /// when a connection that does not use Baton holds SQLite's write lock.
    private func immediateTransaction(
        _ db: Database,
        ticket: TicketLock.Ticket,
        fence: (any Fence)?,
        plan: inout Checkpointer.Plan,
        _ body: (Database) throws -> Void
    ) throws -> Bool {
        defer { finishTurn(ticket, handOff: plan.handsTurnOn) }
        holdingTurn.set(true)
        defer { holdingTurn.set(false) }
        if interruption.isSet { throw suspendedError("write to") }
        let tracked = trackTablesIfWatched(db)
        tryOnce.set(true)
        do {
            try db.cachedStatement(sql: "BEGIN IMMEDIATE TRANSACTION").execute()
            tryOnce.set(false)
        } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY {
            tryOnce.set(false)
            return false
        } catch {
            tryOnce.set(false)
            throw error
        }
        try finishTransaction(db, fence: fence, announce: !tracked, body)
        plan = afterCommit(db)
        return true
    }

    /// Runs the fence check and `body` in the transaction `db` has begun, then commits; rolls
    /// back when either throws. (Cached `BEGIN`/`COMMIT` statements: GRDB's `inTransaction`
    /// parses them on every call.)
    /// With `announce` (no ``CommitBroadcaster`` on the connection), rings the commit signal
    /// after a commit that changed rows.
    private func finishTransaction(_ db: Database, fence: (any Fence)?, announce: Bool, _ body: (Database) throws -> Void) throws {
        do {
            // (SQLite's counter directly: GRDB's checks the calling queue every time.)
            let changesBefore = sqlite3_total_changes64(db.sqliteConnection)
            if let fence { try FenceTable.check(fence, in: db) }
            try body(db)
            try db.cachedStatement(sql: "COMMIT TRANSACTION").execute()
            if announce, sqlite3_total_changes64(db.sqliteConnection) != changesBefore {
                // A table watcher that appeared during the transaction learns of it through
                // the "some table" signal; a relay (``run()``) through the untracked count.
                writerQueue.bumpUntracked()
                announceCommit(tableSignals: writerQueue.watcherCount > 0 ? [anyTableSignal] : [])
            }
        } catch {
            if db.isInsideTransaction { try? db.rollback() }
            throw error
        }
    }

    /// The queued path: on GRDB's writer queue, wait for a ticket, then write.
    private func queuedWrite(
        _ pool: DatabasePool,
        fence: (any Fence)?,
        _ body: @Sendable (Database) throws -> Void
    ) async throws {
        let cancelled = InterruptionFlag()
        do {
            try await withTaskCancellationHandler {
                try await pool.writeWithoutTransaction { db in
                    var plan = Checkpointer.Plan.none
                    try self.writeTransaction(db, fence: fence, cancelled: cancelled, plan: &plan, body)
                    self.checkpointer.runAfterTurn(plan, on: db, thread: self.checkpointThread, patience: self.configuration.busyTimeout)
                }
            } onCancel: {
                cancelled.set(true)
                self.writerQueue.interruptWaiters()
            }
        } catch {
            throw translate(error)
        }
    }

    /// Runs on the writer connection: queue, `BEGIN IMMEDIATE`, fence, body, commit.
    private func writeTransaction(
        _ db: Database,
        fence: (any Fence)?,
        cancelled: InterruptionFlag,
        plan: inout Checkpointer.Plan,
        _ body: (Database) throws -> Void
    ) throws {
        let ticket = try resumeKeptTurn() ?? writerQueue.acquire(deadline: .after(configuration.busyTimeout)) {
            if cancelled.isSet { return CancellationError() }
            if self.interruption.isSet { return self.suspendedError("write to") }
            return nil
        }
        defer { finishTurn(ticket, handOff: plan.handsTurnOn) }
        holdingTurn.set(true)
        defer { holdingTurn.set(false) }
        if interruption.isSet { throw suspendedError("write to") }
        let tracked = trackTablesIfWatched(db)
        let started = ContinuousClock.now
        do {
            try db.cachedStatement(sql: "BEGIN IMMEDIATE TRANSACTION").execute()
        } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY {
            if interruption.isSet { throw suspendedError("write to") }
            let waited = Int((ContinuousClock.now - started).timeInterval * 1000)
            throw BatonError(
                .busy,
                "could not lock \(path) for writing within \(waited) ms: a connection that does not use Baton (the sqlite3 shell, another program) holds the write lock. Retry later or raise the busy timeout",
                cause: error
            )
        }
        try finishTransaction(db, fence: fence, announce: !tracked, body)
        plan = afterCommit(db)
    }

    /// Adds the commit broadcaster to the writer connection while some process watches the
    /// commits of a single table, removes it otherwise (before `BEGIN`, holding the writer
    /// queue). Returns whether it is added.
    func trackTablesIfWatched(_ db: Database) -> Bool {
        let wanted = writerQueue.watcherCount > 0
        if !wanted && !broadcastingInstalled.load(ordering: .relaxed) { return false }
        let change = broadcasting.withLock { broadcasting -> (add: Bool, observer: CommitBroadcaster)? in
            guard wanted != broadcasting.installed else { return nil }
            let observer = broadcasting.observer ?? CommitBroadcaster(database: self)
            broadcasting.observer = observer
            broadcasting.installed = wanted
            broadcastingInstalled.store(wanted, ordering: .relaxed)
            return (wanted, observer)
        }
        if let change {
            if change.add {
                db.add(transactionObserver: change.observer, extent: .databaseLifetime)
            } else {
                db.remove(transactionObserver: change.observer)
            }
        }
        return wanted
    }

    /// The turn this process kept after its last write, if no waiter took it over meanwhile.
    private func resumeKeptTurn() -> TicketLock.Ticket? {
        guard let kept = keptTurn.withLock({ $0.take() }), writerQueue.resume(kept) else { return nil }
        return kept
    }

    /// After a write: keeps the turn for the next write of this process, unless it is handed on
    /// (for a checkpoint), another process waits and the turn has lasted its quantum, or the
    /// process is suspending.
    private func finishTurn(_ ticket: TicketLock.Ticket, handOff: Bool) {
        if handOff || interruption.isSet || writerQueue.shouldYield(ticket) {
            writerQueue.release(ticket)
            return
        }
        writerQueue.keep(ticket)
        keptTurn.withLock { $0 = ticket }
        // A suspension that began meanwhile may have looked for a kept turn already.
        if interruption.isSet { releaseKeptTurn() }
    }

    /// Gives up a kept turn (suspension, closing).
    private func releaseKeptTurn() {
        if let kept = keptTurn.withLock({ $0.take() }) { writerQueue.releaseKept(kept) }
    }

    /// After a commit, still holding the turn: what to do about checkpoints (see
    /// ``Checkpointer``). A restart is run here; a checkpoint, or the wait for one, by the
    /// caller once the turn is handed on.
    private func afterCommit(_ db: Database) -> Checkpointer.Plan {
        if interruption.isSet { return .none }
        let plan = checkpointer.plan()
        switch plan {
        case .restart:
            // A checkpoint of this process's thread holds SQLite's checkpoint lock, which a
            // restart only tries once: wait for it outside the turn, and restart next time.
            if checkpointThread.isBusy { return .awaitCheckpoint }
            handOverTrace("ckpt.restart")
            checkpointer.restart(db, tryOnce: tryOnce)
            handOverTrace("ckpt.restarted")
        case .none: boundWAL(db)
        case .checkpoint, .awaitCheckpoint: break
        }
        return plan
    }

    /// After a commit, still holding the writer queue: when the WAL has grown past
    /// ``Configuration/walRestartSize``, checkpoint with `RESTART` so the next commit starts it
    /// over (and `journal_size_limit` truncates it). Tried every 32nd commit of this process
    /// while the WAL stays that long.
    /// (Readers whose transactions always overlap keep SQLite's passive checkpoints from ever
    /// restarting the WAL, so it would grow without bound.)
    private func boundWAL(_ db: Database) {
        guard checkpointer.walBytes > configuration.walRestartSize,
              localCommits.add(1, ordering: .relaxed).newValue % 32 == 0 else { return }
        // Best effort, waiting at most BusyWait.checkpointTimeout for readers of old snapshots
        // (the other writers wait meanwhile); a failed attempt is retried 32 commits later.
        checkpointing.set(true)
        defer { checkpointing.set(false) }
        _ = try? db.execute(sql: "PRAGMA wal_checkpoint(RESTART)")
    }

    // MARK: - Operations and suspension

    /// The GRDB database pool, for your own GRDB code: `ValueObservation`,
    /// `DatabaseRegionObservation`, records, GRDBQuery's `@Query`, anything that takes a
    /// `DatabaseReader` or `DatabaseWriter`.
    ///
    /// It is the same object for the life of the shared database, across ``suspend()`` and
    /// ``resume()`` (with ``SuspensionMode/closesConnections`` a suspension closes it and
    /// ``resume()`` opens a new one). Writes through it are safe: while a Baton writer of any
    /// process has the writer queue, a write that finds SQLite's lock taken waits in the queue
    /// (woken when the turn is handed on) instead of failing with "database is locked" or
    /// sleeping; while the database is suspended none commits (reads go on): see ``suspend()``
    /// for the errors they fail with. Other processes' commits reach its observations while
    /// ``run()`` runs.
    public var pool: DatabasePool {
        state.withLock { $0.pool! }
    }

    /// ``pool``, as a GRDB `DatabaseWriter`.
    public var writer: any DatabaseWriter { pool }

    private func enter(writing: Bool) throws -> DatabasePool {
        if writing && isReadOnly {
            throw BatonError(.notWritable, "\(path) was opened read-only; open it with SharedDatabase.open to write")
        }
        let expired = container.suspension.isExpired
        return try state.withLock { state -> DatabasePool in
            if state.depth > 0 || expired { throw suspendedError(writing ? "write to" : "read") }
            if state.pool == nil || state.poolClosed {
                // A resume that could not open the database again.
                state.pool = try makePool()
                state.poolClosed = false
                state.versionReader = .unopened
            }
            state.active += 1
            return state.pool!
        }
    }

    /// Counts an operation that the process starts by itself (a checkpoint on its own thread):
    /// `false`, and nothing counted, while the database is suspended or closed by a suspension
    /// (unlike ``enter(writing:)``, it never opens the pool again).
    private func beginBackgroundOperation() -> Bool {
        if isReadOnly || container.suspension.isExpired { return false }
        return state.withLock { state -> Bool in
            guard state.depth == 0, state.pool != nil, !state.poolClosed else { return false }
            state.active += 1
            return true
        }
    }

    private func leave() {
        let drainers = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.active -= 1
            guard state.active == 0 else { return [] }
            defer { state.drainers = [] }
            return state.drainers
        }
        for drainer in drainers { drainer.resume() }
    }

    func suspendedError(_ doing: String) -> BatonError {
        BatonError(.suspended, "cannot \(doing) \(path) while the process is suspended; call resume() first")
    }

    /// Whether operations are refused now.
    public var isSuspended: Bool {
        state.withLock { $0.depth > 0 } || container.suspension.isExpired
    }

    /// Interrupts the running write, rolls back open write transactions, leaves the writer
    /// queue, and refuses new writes until ``resume()``: ``write(_:)`` and ``read(_:)`` throw
    /// `suspended`; writes through ``pool`` never commit (reads through it go on): they throw
    /// `SQLITE_READONLY` (the writer connection is query-only until resume), or, after GRDB
    /// turned `query_only` off for a read of its own on the writer connection (an observation
    /// that starts), `suspended` when they reach their commit (rolled back) or `SQLITE_INTERRUPT`
    /// when the progress handler stops one of their statements first.
    ///
    /// Returns once this process holds no write lock on the database (no RESERVED, PENDING or
    /// EXCLUSIVE lock, no WAL write lock) and no Baton lock on its writer queue. A write closure
    /// already running is interrupted: its statements fail with `SQLITE_INTERRUPT`, and
    /// its transaction is rolled back; `suspend()` waits until it has returned, and for a write
    /// running on ``pool`` to return. Reads are not interrupted (with the default mode), on the
    /// writer connection either (GRDB fetches the values of its observations there: an
    /// interrupted fetch would end the observation).
    ///
    /// With the default ``SuspensionMode/rollsBackWrites`` the pool stays open: its writer
    /// connection is made query-only (`PRAGMA query_only`, which SQLite checks before a write
    /// transaction takes any lock), and refuses every commit (SQLite's commit hook, through a
    /// transaction observer: GRDB turns `query_only` off after each read of its own in its
    /// read-only mode, so a write started after one takes the write lock until its refused commit
    /// or interrupted statement; the refusal then turns `query_only` on again). This database
    /// alone is suspended, not every GRDB database of the process as GRDB's process-wide
    /// `Database.suspendNotification` would. Idle WAL reader connections keep
    /// their shared lock on the `-shm` file, which Apple's rule allows (TN2408: a WAL database is
    /// a problem only with a write transaction open), and observations of ``pool`` keep running.
    /// With ``SuspensionMode/closesConnections`` every statement is interrupted and every
    /// connection closed, so the process holds no lock on the database's files at all.
    ///
    /// Calls nest: each needs a ``resume()``. The container's suspension
    /// (``SharedContainer/suspend()``) suspends the database too, and it alone also releases
    /// Baton's other locks in the container (the signal table's process entry, taken while
    /// commits are observed): call it, not this alone, before the process is suspended.
    public func suspend() async {
        let first = state.withLock { state -> Bool in
            state.depth += 1
            return state.depth == 1 && !state.closed
        }
        guard first else {
            // Wait until the first suspender has released the database.
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let done = state.withLock { state -> Bool in
                    if state.closed || state.depth == 0 || state.pool == nil { return true }
                    state.suspenders.append(continuation)
                    return false
                }
                if done { continuation.resume() }
            }
            return
        }
        let closes = configuration.suspensionMode == .closesConnections
        interruption.set(true)
        if closes { readInterruption.set(true) }
        releaseKeptTurn()
        writerQueue.interruptWaiters()
        let pool = state.withLock { $0.pool }
        if closes {
            // Statements that run now are interrupted; the flags stop the ones that start later.
            pool?.interrupt()
        }
        // A checkpoint on the checkpoint thread is cut short (it is one of the operations
        // waited for below); none starts from now on.
        checkpointThread.interrupt()
        // (Otherwise the writer connection's progress handler, which reads the flag every few
        // steps of SQLite's virtual machine, interrupts its running statement if it runs in a
        // write transaction; reads go on, on every connection.)
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let drained = state.withLock { state -> Bool in
                if state.active == 0 { return true }
                state.drainers.append(continuation)
                return false
            }
            if drained { continuation.resume() }
        }
        // Idle, it holds what an idle WAL reader holds; closed all the same, and opened again
        // by the next claim after the resume.
        checkpointThread.closeConnection()
        if let pool, !isReadOnly {
            // A write through the plain pool may still hold its transaction open between two
            // statements: once it has returned, roll back whatever it left open. Then the writer
            // connection becomes query-only until resume(): SQLite refuses a statement that would
            // start a write transaction (SQLITE_READONLY) before it takes any lock, so a write
            // through the plain pool cannot take the write lock while the process is suspended.
            // GRDB turns query_only off after a read of its own on the writer connection (an
            // observation that starts), so every commit is refused too, whatever turned
            // query_only off (see ``CommitRefusal``).
            // This suspends this database alone, not every database of the process as GRDB's
            // own suspension (a process-wide notification) would.
            let path = self.path, interruption = self.interruption
            let refusal = try? await pool.writeWithoutTransaction { db -> CommitRefusal? in
                if db.isInsideTransaction { try db.rollback() }
                if closes { return nil }
                let refusal = CommitRefusal(db, interruption: interruption, path: path)
                db.add(transactionObserver: refusal, extent: .databaseLifetime)
                _ = try? db.execute(sql: "PRAGMA query_only = 1")
                return refusal
            }
            state.withLock { $0.commitRefusal = refusal }
        }
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            if state.depth > 0 {
                if closes, let pool, state.pool === pool {
                    // (No dataVersion() runs now: it is an operation, and they have drained.)
                    state.versionReader.close()
                    try? pool.close()
                    state.poolClosed = true
                }
                state.closed = true
            }
            defer { state.suspenders = [] }
            return state.suspenders
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Ends one ``suspend()``; the last one lets writes run again (with
    /// ``SuspensionMode/closesConnections``, it opens a new connection pool). After the container
    /// was told it expires, this does nothing.
    /// - Throws: An error opening the database again (it is retried on the next read or write).
    public func resume() async throws {
        let reopen = state.withLock { state -> Bool in
            guard state.depth > 0 else { return false }
            state.depth -= 1
            return state.depth == 0
        }
        guard reopen, !container.suspension.isExpired else { return }
        interruption.set(false)
        readInterruption.set(false)
        let (pool, refusal) = state.withLock { state in
            defer { state.commitRefusal = nil }
            return (state.pool, state.commitRefusal)
        }
        if let refusal, let pool {
            try await pool.writeWithoutTransaction { db in
                db.remove(transactionObserver: refusal)
                try db.execute(sql: "PRAGMA query_only = 0")
            }
        }
        try state.withLock { state in
            state.closed = false
            if state.poolClosed, state.depth == 0 {
                state.pool = try makePool()
                state.poolClosed = false
                state.versionReader = .unopened
            }
        }
    }

    /// Forwards the container's suspension to the database (held weakly: the container keeps
    /// its participants).
    private final class SuspensionHook: SuspensionParticipant {
        weak let database: SharedDatabase?
        init(_ database: SharedDatabase) { self.database = database }
        func suspend() async { await database?.suspend() }
        func resume() async throws { try await database?.resume() }
    }

    // MARK: - Internal access for observation

    /// `PRAGMA data_version` (changes when another connection commits), with the identity of the
    /// connection it was read from: values of different connections cannot be compared.
    ///
    /// Read on the calling thread, on a connection of its own (``DataVersionReader``): in WAL
    /// mode a reader never waits for a writer, and nothing else uses that connection, so this
    /// neither holds the thread behind the app's long write through ``pool`` (which GRDB's
    /// synchronous access to the writer connection did) nor costs two thread hops per change
    /// seen (which its asynchronous access did, and the value still waited for that write).
    /// That connection sees every commit of the other connections, this process's writer
    /// connection included (the writer connection saw neither its own commits nor those of
    /// writes through ``pool``: a write through ``pool`` that rings no signal, with no table
    /// watcher, is now seen as a change by another program within
    /// ``Configuration/externalChangePollInterval``, as other processes see it).
    ///
    /// While suspended it throws `suspended`, like any operation. When the connection cannot
    /// be opened (or, for one call, while another connection recovers the WAL: `SQLITE_BUSY`),
    /// it reads the writer connection's value with GRDB's asynchronous access, as before.
    func dataVersion() async throws -> DataVersion {
        let pool = try enter(writing: false)
        defer { leave() }
        if let reader = versionReader() {
            do {
                return DataVersion(connection: .dedicated(reader.identity), value: try reader.read())
            } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY {
                // (WAL recovery: rare and short. The writer connection's value differs from the
                // dedicated connection's, so the caller sees one change that may not be one.)
            } catch {
                throw translate(error)
            }
        }
        writerAccesses.add(1, ordering: .acquiringAndReleasing)
        defer { writerAccesses.subtract(1, ordering: .releasing) }
        do {
            let value = try await pool.writeWithoutTransaction { db in
                try Int.fetchOne(db, sql: "PRAGMA data_version") ?? 0
            }
            return DataVersion(connection: .writer(ObjectIdentifier(pool)), value: value)
        } catch {
            throw translate(error)
        }
    }

    /// The connection for ``dataVersion()`` (called as an operation, so no suspension closes it
    /// meanwhile), opened on first use after each opening of the pool; `nil` if it could not be
    /// opened.
    func versionReader() -> DataVersionReader? {
        switch state.withLock({ $0.versionReader }) {
        case .open(let reader): return reader
        case .unavailable: return nil
        case .unopened: break
        }
        // Opened outside the lock (it reads the schema); a caller that lost the race closes its own.
        let opened = try? DataVersionReader(path: path)
        let (chosen, spare) = state.withLock { state -> (DataVersionReader?, DataVersionReader?) in
            switch state.versionReader {
            case .open(let reader): return (reader, opened)
            case .unavailable: return (nil, opened)
            case .unopened:
                state.versionReader = opened.map { .open($0) } ?? .unavailable
                return (opened, nil)
            }
        }
        spare?.close()
        return chosen
    }

    /// Reads on the calling thread (GRDB's synchronous read runs there when a reader is free):
    /// for the observation's fetch after a change, which would otherwise cost two thread hops.
    /// Like a synchronous GRDB read, it holds the calling thread for the read's duration.
    func readNow<T>(_ body: (Database) throws -> T) throws -> T {
        let pool = try enter(writing: false)
        defer { leave() }
        do {
            return try pool.read(body)
        } catch {
            throw translate(error)
        }
    }

    /// Runs `body` on the writer connection without a transaction, as an operation (refused
    /// with `suspended` while suspended; a suspension waits for it).
    func writerAccess<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let pool = try enter(writing: false)
        defer { leave() }
        writerAccesses.add(1, ordering: .acquiringAndReleasing)
        defer { writerAccesses.subtract(1, ordering: .releasing) }
        do {
            return try await pool.writeWithoutTransaction(body)
        } catch {
            throw translate(error)
        }
    }

    /// A `data_version` value and the connection it was read from.
    struct DataVersion: Equatable {
        enum Connection: Equatable {
            /// A ``DataVersionReader``, by its identity (new for every connection opened).
            case dedicated(UInt64)
            /// The writer connection of a pool (when the dedicated one could not be used).
            case writer(ObjectIdentifier)
        }
        var connection: Connection
        var value: Int
    }

    // MARK: - Paths

    static func absolutePath(_ path: String) throws -> String {
        guard !path.isEmpty else {
            throw BatonError(.invalidArgument, "the database path is empty")
        }
        var absolute = path
        if !path.hasPrefix("/") {
            absolute = FileManager.default.currentDirectoryPath + "/" + path
        }
        // Resolve the directory (the file may not exist yet) so that every process names the
        // same file the same way.
        let url = URL(fileURLWithPath: absolute)
        let directory = url.deletingLastPathComponent().path
        guard let resolved = realpath(directory, nil) else {
            throw BatonError(.notFound, "the directory of the database \(path) does not exist; create it first")
        }
        defer { free(resolved) }
        return String(cString: resolved) + "/" + url.lastPathComponent
    }

    /// FNV-1a 64 of the absolute path, as 16 hex digits.
    package static func identifier(ofPath path: String) -> String {
        let hex = String(FNV1a.hash(path), radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}

extension Duration {
    /// The duration in seconds.
    var timeInterval: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
