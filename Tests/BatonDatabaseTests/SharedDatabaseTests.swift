import Baton
import BatonDatabase
import BatonFixtures
import Foundation
import GRDB
import Synchronization
import BatonTestSupport
import Testing

/// Starts a process that holds the database inside a write transaction, then opens it here with
/// the given busy timeout.
func openBehindAHolder(
    _ path: String, in directory: TemporaryContainer, busyTimeout: Duration,
    suspensionMode: SharedDatabase.SuspensionMode = .rollsBackWrites
) async throws -> (holder: ChildProcess, database: SharedDatabase) {
    let holder = try ChildProcess(harness: ["db-test", "hold", path, "--count", "1"], container: directory.path)
    try await holder.line(timeout: 30) { $0 == "in-transaction" }
    let container = try SharedContainer(path: directory.path)
    var configuration = SharedDatabase.Configuration()
    configuration.busyTimeout = busyTimeout
    configuration.suspensionMode = suspensionMode
    let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator(), configuration: configuration)
    return (holder, database)
}

func count(_ database: SharedDatabase, _ sql: String = "SELECT count(*) FROM item") async throws -> Int {
    try await database.read { db in try Int.fetchOne(db, sql: sql) ?? -1 }
}

/// The size of the database's WAL file (0 when there is none).
func walSize(_ databasePath: String) throws -> Int {
    try FileManager.default.attributesOfItem(atPath: databasePath + "-wal")[.size] as? Int ?? 0
}

/// A fence backed by a real file holding the current epoch (stands in for a role's lease).
struct FileEpochFence: Fence {
    let file: String
    let scope: String
    let epoch: UInt64
    /// When false, `validate()` passes whatever the file says (a holder that validated just
    /// before it was preempted): only the database's own record can stop it.
    var checksFile = true

    static func setEpoch(_ epoch: UInt64, in file: String) throws {
        try String(epoch).write(toFile: file, atomically: true, encoding: .utf8)
    }

    func validate() throws {
        guard checksFile else { return }
        let current = UInt64(try String(contentsOfFile: file, encoding: .utf8)) ?? 0
        if current != epoch {
            throw BatonError(.fenced, "epoch \(epoch) of \(scope) is stale; current epoch \(current)")
        }
    }
}

final class Flag: Sendable {
    let value = Atomic<Bool>(false)
}

/// The app holding GRDB's writer connection through `pool` until released: inside a write
/// transaction that inserted `row` (`pool.write`), or outside any transaction (`row` nil,
/// `pool.writeWithoutTransaction`: other processes can commit meanwhile). `bound` is a safety
/// bound, so that a failing test does not hang; ``end()`` says whether the hold lasted until
/// it was released.
final class HeldWriterConnection: Sendable {
    private let ended: Flag
    private let release: Flag
    private let releasedInTime: Flag
    private let task: Task<Void, any Error>

    /// Starts the hold; returns once it holds the connection.
    init(_ pool: DatabasePool, inserting row: (writer: Int, seq: Int)?, bound: Duration) async throws {
        let holding = Flag(), ended = Flag(), release = Flag(), releasedInTime = Flag()
        self.ended = ended
        self.release = release
        self.releasedInTime = releasedInTime
        task = Task.detached {
            @Sendable func hold() {
                holding.value.store(true, ordering: .relaxed)
                let deadline = ContinuousClock.now + bound
                while !release.value.load(ordering: .relaxed), ContinuousClock.now < deadline { usleep(1_000) }
                releasedInTime.value.store(release.value.load(ordering: .relaxed), ordering: .relaxed)
                ended.value.store(true, ordering: .relaxed)
            }
            if let row {
                try await pool.write { db in
                    try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (?, ?)", arguments: [row.writer, row.seq])
                    hold()
                }
            } else {
                try await pool.writeWithoutTransaction { _ in hold() }
            }
        }
        while !holding.value.load(ordering: .relaxed) { try await Task.sleep(for: .milliseconds(5)) }
    }

    /// Releases the connection after `delay`, in a task of its own, whatever the test does
    /// meanwhile.
    func release(after delay: Duration) -> Task<Void, Never> {
        Task.detached { [release] in
            try? await Task.sleep(for: delay)
            release.value.store(true, ordering: .relaxed)
        }
    }

    /// Whether the hold is still on: not yet released (by ``end()`` or ``release(after:)``) and
    /// `bound` not yet reached.
    var isHeld: Bool { !ended.value.load(ordering: .relaxed) }

    /// Releases the connection and waits for the write to end.
    /// - Returns: Whether it was still held when released (not ended at `bound`).
    @discardableResult
    func end() async throws -> Bool {
        release.value.store(true, ordering: .relaxed)
        try await task.value
        return releasedInTime.value.load(ordering: .relaxed)
    }
}

@Suite("Shared database", .serialized)
struct SharedDatabaseTests {
    @Test("4 processes x 2,000 single-row writes at once: every row present, no error")
    func concurrentWritersLoseNothing() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let writers = try (1...4).map { writer in
            // (A busy timeout above the default 5 s: on a loaded 2-core runner four writers
            // plus the other suites can keep one waiting longer, and this test is about losing
            // nothing, not about the wait.)
            try ChildProcess(harness: ["db-test", "write", path, "--count", "2000", "--writer", "\(writer)", "--busy-timeout", "60"], container: directory.path)
        }
        for child in writers {
            let status = try await child.wait(timeout: 120)
            #expect(status == 0, "writer said: \(child.lines)")
            #expect(child.lines.contains("done 2000"))
            #expect(!child.lines.contains { $0.hasPrefix("error") })
        }
        let container = try SharedContainer(path: directory.path)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator())
        #expect(try await count(database) == 8_000)
        for writer in 1...4 {
            #expect(try await count(database, "SELECT count(DISTINCT seq) FROM item WHERE writer = \(writer)") == 2_000)
        }
        #expect(try await count(database, "SELECT count(*) FROM creation_log") == 1)
        let wal = try walSize(path)
        #expect(wal <= 16 << 20, "the WAL stays within its size bound (\(wal) bytes)")
    }

    @Test("the WAL stays bounded while readers come and go")
    func walStaysBoundedUnderReaders() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let container = try SharedContainer(path: directory.path)
        var configuration = SharedDatabase.Configuration()
        configuration.checkpointPages = 64
        configuration.journalSizeLimit = 256 << 10
        configuration.walRestartSize = 1 << 20
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator(), configuration: configuration)
        let stop = Flag()
        // Two readers whose read transactions always overlap: SQLite's passive checkpoints
        // alone could never start the WAL over.
        let readers = (0..<2).map { index in
            Task {
                if index == 1 { try await Task.sleep(for: .milliseconds(10)) }
                while !stop.value.load(ordering: .relaxed) {
                    try await database.read { db in
                        _ = try Int.fetchOne(db, sql: "SELECT count(*) FROM item")
                        usleep(20_000)
                    }
                }
            }
        }
        // 3,000 commits of 2 kB rows: without restarts the WAL holds them all (38 MB; 76 MB for
        // 6,000 when the restarts are turned off). Each restart is best effort (it waits 50 ms
        // for readers of old snapshots, and is retried 32 commits later), so a loaded machine
        // delays them: runs with two test processes and a CPU hog on 2 cores ended at 3.6 and
        // 4.7 MB. The bound is a quarter of the unbounded size.
        let payload = String(repeating: "x", count: 2_000)
        for seq in 0..<3_000 {
            try await database.write { db in
                try db.execute(sql: "INSERT INTO item(writer, seq, text) VALUES (1, ?, ?)", arguments: [seq, payload])
            }
        }
        stop.value.store(true, ordering: .relaxed)
        for reader in readers { try await reader.value }
        let wal = try walSize(path)
        #expect(wal <= 10 << 20, "WAL is \(wal) bytes after 3,000 commits")
    }

    @Test("kill -9 during a transaction leaves no partial rows, and the writer queue goes on")
    func killDuringTransaction() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let holder = try ChildProcess(harness: ["db-test", "hold", path, "--count", "100"], container: directory.path)
        try await holder.line(timeout: 30) { $0 == "in-transaction" }
        // A second writer queues behind the holder. Its patience runs from its own start, and
        // the SIGKILL below comes when this test's task next runs: under load that took more
        // than the default 5 s, and the waiter gave up (`busy`) before the kill.
        let waiter = try ChildProcess(harness: ["db-test", "write", path, "--count", "5", "--writer", "7", "--busy-timeout", "60"], container: directory.path)
        try await waiter.line(timeout: 30) { $0 == "ready" }
        holder.signal(SIGKILL)
        #expect(try await holder.wait() == 128 + SIGKILL)
        #expect(try await waiter.wait(timeout: 30) == 0, "waiter said: \(waiter.lines)")

        let container = try SharedContainer(path: directory.path)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator())
        #expect(try await count(database, "SELECT count(*) FROM item WHERE writer = -1") == 0)
        #expect(try await count(database, "SELECT count(*) FROM item WHERE writer = 7") == 5)
        let integrity = try await database.read { db in try String.fetchOne(db, sql: "PRAGMA integrity_check") }
        #expect(integrity == "ok")
        try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (8, 0)") }
    }

    @Test("a writer stopped (SIGSTOP) while it keeps its turn between writes does not hold up the others")
    func aStoppedWriterKeepingItsTurnIsTakenOver() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        // The child writes, keeps its turn in the writer queue for its next write, and is then
        // stopped, as iOS suspends an app between two writes.
        let writer = try ChildProcess(harness: ["db-test", "write", path, "--count", "20", "--writer", "1", "--stay"], container: directory.path)
        try await writer.line(timeout: 30) { $0 == "done 20" }
        writer.signal(SIGSTOP)
        defer { writer.signal(SIGKILL) }
        let container = try SharedContainer(path: directory.path)
        var configuration = SharedDatabase.Configuration()
        configuration.busyTimeout = .seconds(10)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator(), configuration: configuration)
        // Without the take-over this waits for the whole busy timeout and throws `busy` (the
        // writer is stopped: it never gives its turn back).
        for seq in 0..<3 {
            try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (2, ?)", arguments: [seq]) }
        }
        #expect(try await count(database, "SELECT count(*) FROM item") == 23)
        // Woken again, the child's next write queues normally.
        writer.signal(SIGCONT)
    }

    @Test("a write that cannot get its turn throws busy, saying who holds the database")
    func busyNamesTheHolder() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let (holder, database) = try await openBehindAHolder(path, in: directory, busyTimeout: .milliseconds(300))
        do {
            try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (9, 9)") }
            Issue.record("a write succeeded while another process held the database")
        } catch let error as BatonError {
            #expect(error.code == .busy)
            #expect((error.cause as? HolderProcess)?.pid == holder.pid, "\(error)")
            #expect(error.message.contains("\(holder.pid)"))
        }
        holder.signal(SIGKILL)
        _ = try await holder.wait()
        try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (9, 9)") }
        #expect(try await count(database) == 1)
    }

    @Test("8 processes open a new database at once: all succeed, the schema is created once")
    func eightProcessesOpenAtOnce() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let openers = try (0..<8).map { _ in
            try ChildProcess(harness: ["db-test", "open", path, "--slow-migration"], container: directory.path)
        }
        for child in openers {
            #expect(try await child.wait(timeout: 60) == 0, "opener said: \(child.lines)")
            #expect(child.lines.contains("opened"))
        }
        let container = try SharedContainer(path: directory.path)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator())
        #expect(try await count(database, "SELECT count(*) FROM creation_log") == 1)
    }

    @Test("closesConnections: suspend() with a long write running leaves no lock in /proc/locks; calls nest; expire wins")
    func suspendReleasesEveryLock() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let container = try SharedContainer(path: directory.path)
        var configuration = SharedDatabase.Configuration()
        configuration.suspensionMode = .closesConnections
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator(), configuration: configuration)
        _ = try await count(database)
        #expect(!ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true).isEmpty, "an open WAL database holds a lock on -shm")

        // The long write parks a pool thread until this task suspends the database.
        try await PoolThreadGate.exclusive {
            let started = Atomic<Bool>(false)
            let longWrite = Task {
                try await database.write { db in
                    started.store(true, ordering: .relaxed)
                    for seq in 0..<50_000_000 {
                        try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (-2, ?)", arguments: [seq])
                    }
                }
        }
        while !started.load(ordering: .relaxed) { try await Task.sleep(for: .milliseconds(5)) }
        try await Task.sleep(for: .milliseconds(50))

        await database.suspend()
        #expect(ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true).isEmpty, "locks after suspend: \(ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true))")
        let outcome = await longWrite.result
        #expect(throws: BatonError.self) { try outcome.get() }
        await #expect { try await count(database) } throws: { ($0 as? BatonError)?.code == .suspended }
        await #expect { try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, 1)") } } throws: {
            ($0 as? BatonError)?.code == .suspended
        }

        }

        // Nested: two suspensions need two resumes.
        await database.suspend()
        try await database.resume()
        #expect(database.isSuspended)
        try await database.resume()
        #expect(!database.isSuspended)
        #expect(try await count(database, "SELECT count(*) FROM item WHERE writer = -2") == 0, "the interrupted write was rolled back")
        try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, 1)") }
        #expect(try await count(database) == 1)

        // The container's suspension suspends the database; after expire, resume does nothing.
        await container.suspend()
        #expect(database.isSuspended)
        #expect(ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true).isEmpty)
        await container.suspension.expire()
        try await container.resume()
        try await database.resume()
        #expect(database.isSuspended)
        await #expect { try await count(database) } throws: { ($0 as? BatonError)?.code == .suspended }
        #expect(ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true).isEmpty)
    }

    @Test("suspend() abandons a write waiting in the writer queue; the queue goes on")
    func suspendWhileQueued() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let (holder, database) = try await openBehindAHolder(path, in: directory, busyTimeout: .seconds(60), suspensionMode: .closesConnections)
        let queued = Task {
            try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (3, 1)") }
        }
        try await Task.sleep(for: .milliseconds(200))
        await database.suspend()
        #expect(ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true).isEmpty)
        do {
            try await queued.value
            Issue.record("the queued write succeeded while another process held the database")
        } catch let error as BatonError {
            #expect(error.code == .suspended, "\(error)")
        }
        holder.signal(SIGKILL)
        _ = try await holder.wait()
        try await database.resume()
        // Neither the abandoned ticket nor the dead holder's blocks the queue.
        let writer = try ChildProcess(harness: ["db-test", "write", path, "--count", "3", "--writer", "4"], container: directory.path)
        #expect(try await writer.wait(timeout: 30) == 0, "writer said: \(writer.lines)")
        try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (3, 2)") }
        #expect(try await count(database) == 4)
    }

    @Test("suspend() interrupts a write waiting for SQLite's lock held by a program that does not use Baton")
    func suspendWhileBusyInSQLite() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let container = try SharedContainer(path: directory.path)
        var configuration = SharedDatabase.Configuration()
        configuration.busyTimeout = .seconds(60)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator(), configuration: configuration)
        // A plain connection (no Baton) holds the write lock, on a thread of its own.
        let plain = try DatabaseQueue(path: path)
        let began = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0), finished = DispatchSemaphore(value: 0)
        let thread = Thread {
            try? plain.writeWithoutTransaction { db in
                try db.execute(sql: "BEGIN IMMEDIATE")
                began.signal()
                release.wait()
                try db.execute(sql: "ROLLBACK")
            }
            finished.signal()
        }
        thread.start()
        began.wait()
        let blocked = Task {
            try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (3, 1)") }
        }
        try await Task.sleep(for: .milliseconds(200))
        await database.suspend()
        do {
            try await blocked.value
            Issue.record("a write succeeded while another connection held the write lock")
        } catch let error as BatonError {
            #expect(error.code == .suspended, "\(error)")
        }
        release.signal()
        finished.wait()
        try plain.close()
        try await database.resume()
        try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (3, 2)") }
        #expect(try await count(database) == 1)
    }

    @Test("a stale lease's write is rejected and writes nothing")
    func staleFenceIsRejected() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let epochFile = directory.path + "/epoch"
        let container = try SharedContainer(path: directory.path)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator())

        try FileEpochFence.setEpoch(1, in: epochFile)
        let first = FileEpochFence(file: epochFile, scope: "sync", epoch: 1)
        try await database.write(fencedBy: first) { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, 1)") }

        // A newer holder takes over and writes.
        try FileEpochFence.setEpoch(2, in: epochFile)
        let second = FileEpochFence(file: epochFile, scope: "sync", epoch: 2)
        try await database.write(fencedBy: second) { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (2, 1)") }

        // The old holder's write is refused by its lease...
        await #expect { try await database.write(fencedBy: first) { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, 2)") } } throws: {
            ($0 as? BatonError)?.code == .fenced
        }
        // ...and by the database itself when the lease check raced with the takeover.
        let racing = FileEpochFence(file: epochFile, scope: "sync", epoch: 1, checksFile: false)
        do {
            try await database.write(fencedBy: racing) { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, 3)") }
            Issue.record("a write under epoch 1 succeeded after epoch 2 wrote")
        } catch let error as BatonError {
            #expect(error.code == .fenced)
            #expect((error.cause as? FenceConflict)?.currentEpoch == 2)
        }
        #expect(try await count(database, "SELECT count(*) FROM item WHERE writer = 1") == 1)
        #expect(try await count(database, "SELECT count(*) FROM item WHERE writer = 2") == 1)
    }

    @Test("an observer in one process sees another process's insert")
    func observerSeesOtherProcess() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let container = try SharedContainer(path: directory.path)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator())

        // Another process observes; this one inserts.
        let observer = try ChildProcess(harness: ["db-test", "observe", path], container: directory.path)
        try await observer.line(timeout: 30) { $0 == "count 0" }
        try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, 1)") }
        try await observer.line(timeout: 10) { $0 == "count 1" }

        // This process observes; another one inserts.
        var values = database.observe { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM item") ?? 0 }.makeAsyncIterator()
        #expect(try await values.next() == 1)
        let writer = try ChildProcess(harness: ["db-test", "write", path, "--count", "1", "--writer", "2"], container: directory.path)
        #expect(try await writer.wait() == 0)
        var seen = 1
        while seen != 2 { seen = try #require(try await values.next()) }
        #expect(seen == 2)
    }

    @Test("a change made by a program that does not use Baton (the sqlite3 shell, a plain connection) is noticed")
    func externalChangeIsNoticed() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let container = try SharedContainer(path: directory.path)
        var configuration = SharedDatabase.Configuration()
        configuration.externalChangePollInterval = .milliseconds(100)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator(), configuration: configuration)
        var values = database.observe { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM item") ?? 0 }.makeAsyncIterator()
        #expect(try await values.next() == 0)

        // A plain GRDB connection: no Baton, no signal.
        let plain = try DatabaseQueue(path: path)
        try await plain.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (5, 1)") }
        try plain.close()
        var seen = 0
        while seen != 1 { seen = try #require(try await values.next()) }

        let shell = ["/usr/bin/sqlite3", "/bin/sqlite3"].first { FileManager.default.isExecutableFile(atPath: $0) }
        if let shell {
            #expect(try await runProgram(shell, [path, "INSERT INTO item(writer, seq) VALUES (6, 1);"]).status == 0)
            while seen != 2 { seen = try #require(try await values.next()) }
        }
    }

    @Test("a corrupt or non-SQLite file gives a clear error, not a crash")
    func corruptFileGivesClearError() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)

        let text = directory.path + "/notes.sqlite"
        try String(repeating: "not a database\n", count: 400).write(toFile: text, atomically: true, encoding: .utf8)
        await #expect { try await SharedDatabase.open(at: text, container: container, migrator: TestSchema.migrator()) } throws: {
            ($0 as? BatonError)?.code == .notADatabase
        }
        await #expect { try await SharedDatabase.openReadOnly(at: text, container: container) } throws: {
            ($0 as? BatonError)?.code == .notADatabase
        }
        let checkText = try await runBaton(["db", "check", text], container: directory.path)
        #expect(checkText.status == 6)

        // A real database whose table pages were overwritten.
        let broken = directory.path + "/broken.sqlite"
        do {
            let queue = try DatabaseQueue(path: broken)
            try await queue.write { db in
                try db.execute(sql: "CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT)")
                for index in 0..<2_000 { try db.execute(sql: "INSERT INTO t(payload) VALUES (?)", arguments: [String(repeating: "x", count: 100) + "\(index)"]) }
            }
            try queue.close()
        }
        let handle = try FileHandle(forUpdating: URL(fileURLWithPath: broken))
        try handle.seek(toOffset: 4096 * 3)
        handle.write(Data(repeating: 0xA5, count: 4096 * 20))
        try handle.close()
        let database = try await SharedDatabase.open(at: broken, container: container, migrator: DatabaseMigrator())
        await #expect { try await database.read { db in try Int.fetchOne(db, sql: "SELECT sum(length(payload)) FROM t") } } throws: {
            ($0 as? BatonError)?.code == .corrupt
        }
        let check = try await runBaton(["db", "check", broken, "--json"], container: directory.path)
        #expect(check.status == 6)
        #expect(check.lines.contains { $0.contains("\"integrity_ok\":false") })
    }

    @Test("read-only opening: nil before the database exists, works while no writer runs")
    func readOnlyWithoutWriter() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let container = try SharedContainer(path: directory.path)
        #expect(try await SharedDatabase.openReadOnly(at: path, container: container, migrator: TestSchema.migrator()) == nil)

        let writer = try ChildProcess(harness: ["db-test", "write", path, "--count", "3", "--writer", "1"], container: directory.path)
        #expect(try await writer.wait() == 0)
        #expect(FileManager.default.fileExists(atPath: path + "-wal"), "persistent WAL keeps -wal")
        #expect(FileManager.default.fileExists(atPath: path + "-shm"), "persistent WAL keeps -shm")

        var newer = TestSchema.migrator()
        newer.registerMigration("v2") { db in try db.execute(sql: "CREATE TABLE later (id INTEGER PRIMARY KEY)") }
        #expect(try await SharedDatabase.openReadOnly(at: path, container: container, migrator: newer) == nil, "migrations incomplete")

        let reader = try #require(try await SharedDatabase.openReadOnly(at: path, container: container, migrator: TestSchema.migrator()))
        #expect(try await count(reader) == 3)
        await #expect { try await reader.write { db in try db.execute(sql: "DELETE FROM item") } } throws: {
            ($0 as? BatonError)?.code == .notWritable
        }
    }

    @Test("baton db check reports integrity, journal mode, schema and the processes holding the database")
    func checkCommand() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let observer = try ChildProcess(harness: ["db-test", "observe", path], container: directory.path)
        try await observer.line(timeout: 30) { $0 == "count 0" }
        let check = try await runBaton(["db", "check", path, "--json"], container: directory.path)
        #expect(check.status == 0)
        let line = try #require(check.lines.first { $0.hasPrefix("{") })
        let report = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(report["integrity_ok"] as? Bool == true)
        #expect(report["journal_mode"] as? String == "wal")
        #expect(report["migrations"] as? [String] == ["v1"])
        let holders = try #require(report["holders"] as? [[String: Any]])
        #expect(holders.contains { ($0["pid"] as? Int) == Int(observer.pid) }, "holders: \(holders)")
    }

    @Test("commits(table:) reports another process's commits to that table, with their sequence and process")
    func tableCommitsAreSignalled() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let container = try SharedContainer(path: directory.path)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator())
        let commits = try await database.commits(table: "item")
        let writer = try ChildProcess(harness: ["db-test", "write", path, "--count", "3", "--writer", "1"], container: directory.path)
        #expect(try await writer.wait() == 0)
        let seen = try await within(30, "the commits of table item") {
            var iterator = commits.makeAsyncIterator()
            var seen: [DatabaseCommit] = []
            while seen.reduce(0, { $0 + $1.count }) < 3, let commit = try await iterator.next() { seen.append(commit) }
            return seen
        }
        #expect(seen.reduce(0) { $0 + $1.count } == 3)
        #expect(seen.allSatisfy { !$0.isExternal && $0.processID == writer.pid })
    }

    @Test("baton db watch prints the commits of other processes")
    func watchCommand() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let opener = try ChildProcess(harness: ["db-test", "open", path], container: directory.path)
        #expect(try await opener.wait() == 0)
        let watch = try ChildProcess(["db", "watch", path, "--count", "3", "--timeout", "30", "--announce"], container: directory.path)
        try await watch.line(timeout: 30) { $0 == "ready" }
        let writer = try ChildProcess(harness: ["db-test", "write", path, "--count", "3", "--writer", "1"], container: directory.path)
        #expect(try await writer.wait() == 0)
        #expect(try await watch.wait(timeout: 30) == 0, "watch said: \(watch.lines)")
        #expect(watch.lines.contains { $0.hasPrefix("commit seq=") })
    }
}
