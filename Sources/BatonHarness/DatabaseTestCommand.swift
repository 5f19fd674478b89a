import ArgumentParser
import Baton
import BatonFixtures
import BatonCommandSupport
import BatonDatabase
import CBatonShims
import GRDB

/// `baton-harness db-test MODE PATH`: worker processes for the shared database's tests.
/// Every mode opens the database with ``TestSchema/migrator``.
struct DatabaseTestCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "db-test", abstract: "Shared database test workers.")

    enum Mode: String, ExpressibleByArgument {
        /// Open (and migrate), print `opened`, exit.
        case open
        /// Insert --count rows as writer --writer, one transaction each; print `done N`.
        case write
        /// Insert --count rows in one transaction, print `in-transaction`, then block forever.
        case hold
        /// Print `count N` for every fresh value of the number of rows.
        case observe
        /// Insert --count rows into `creation_log` (another table than `item`), one transaction
        /// each, through `SharedDatabase.write`; print `done N`.
        case log
        /// Like `log`, but each commit's announcement comes 400 ms after its COMMIT (an
        /// observer added before Baton's sleeps in `databaseDidCommit`, holding the writer
        /// queue's turn): a writer descheduled at the worst moment.
        case slowLog = "slow-log"
        /// Insert --count rows as writer --writer through the plain GRDB pool
        /// (`SharedDatabase.pool.write`, no writer queue); print `done N` with the monotonic
        /// time in ns, or `error ...`.
        case poolWrite = "pool-write"
        /// Open a plain connection (no Baton, no busy timeout) and try `BEGIN IMMEDIATE`; print
        /// `free` or `locked` (whether another connection holds the write lock).
        case tryLock = "try-lock"
    }

    @OptionGroup var options: ContainerOptions
    @Argument var mode: Mode
    @Argument var path: String
    @Option(transform: ArgumentCheck.count) var count: Int = 1
    @Option(transform: ArgumentCheck.count) var writer: Int = 0
    @Flag(help: "Make the migration slow (widens the window of concurrent opens).") var slowMigration = false
    @Flag(help: "After writing, keep running with the database open until killed.") var stay = false
    @Option(help: "Configuration.checkpointPages.", transform: ArgumentCheck.positiveCount) var checkpointPages: Int?
    @Option(help: "Configuration.walRestartSize, in bytes.", transform: ArgumentCheck.count) var walRestartSize: Int?
    @Option(help: "Configuration.busyTimeout, in seconds.", transform: ArgumentCheck.positiveSeconds) var busyTimeout: Double?

    func run() async throws {
        if mode == .tryLock {
            var configuration = GRDB.Configuration()
            configuration.busyMode = .immediateError
            let queue = try DatabaseQueue(path: path, configuration: configuration)
            do {
                try await queue.writeWithoutTransaction { db in
                    try db.execute(sql: "BEGIN IMMEDIATE")
                    try db.execute(sql: "ROLLBACK")
                }
                emit("free")
            } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY {
                emit("locked")
            }
            return
        }
        let container = try options.open()
        var configuration = SharedDatabase.Configuration()
        if let checkpointPages { configuration.checkpointPages = checkpointPages }
        if let walRestartSize { configuration.walRestartSize = walRestartSize }
        if let busyTimeout { configuration.busyTimeout = .seconds(busyTimeout) }
        if mode == .slowLog {
            configuration.prepareDatabase = { db in
                if !db.configuration.readonly { db.add(transactionObserver: SlowAnnouncement(), extent: .databaseLifetime) }
            }
        }
        let database = try await SharedDatabase.open(
            at: path, container: container, migrator: TestSchema.migrator(slow: slowMigration), configuration: configuration)
        switch mode {
        case .open:
            emit("opened")
        case .write:
            let writer = self.writer
            emit("ready")
            for seq in 0..<count {
                do {
                    try await database.write { db in
                        try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (?, ?)", arguments: [writer, seq])
                    }
                } catch {
                    emit("error \(error)")
                    throw ExitCode(1)
                }
            }
            emit("done \(count)")
            if stay {
                while true { try await Task.sleep(for: .seconds(3600)) }
            }
        case .hold:
            let rows = count
            try await database.write { db in
                for seq in 0..<rows {
                    try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (?, ?)", arguments: [-1, seq])
                }
                emit("in-transaction")
                while true { sleep(60) }
            }
        case .log, .slowLog:
            for _ in 0..<count {
                try await database.write { db in
                    try db.execute(sql: "INSERT INTO creation_log(pid) VALUES (?)", arguments: [Int(getpid())])
                }
            }
            emit("done \(count)")
        case .poolWrite:
            let writer = self.writer
            emit("ready")
            do {
                for seq in 0..<count {
                    try await database.pool.write { db in
                        try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (?, ?)", arguments: [writer, seq])
                    }
                }
            } catch {
                emit("error \(error)")
                throw ExitCode(1)
            }
            emit("done \(count) \(monotonicNanoseconds())")
        case .tryLock:
            break
        case .observe:
            for try await value in database.observe({ db in try Int.fetchOne(db, sql: "SELECT count(*) FROM item") ?? 0 }) {
                emit("count \(value)")
            }
        }
    }
}

/// Sleeps 400 ms after each commit, before the observers added after it (Baton's commit
/// broadcaster) hear of it.
private final class SlowAnnouncement: TransactionObserver, @unchecked Sendable {
    func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool { true }
    func databaseDidChange(with event: DatabaseEvent) {}
    func databaseDidCommit(_ db: Database) { usleep(400_000) }
    func databaseDidRollback(_ db: Database) {}
}
