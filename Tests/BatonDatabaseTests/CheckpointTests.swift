import Baton
@testable import BatonDatabase
import BatonFixtures
import Foundation
import GRDB
import GRDBSQLite
import Logging
import Synchronization
import BatonTestSupport
import Testing

@Suite("Checkpoints outside the writer's turn", .serialized)
struct CheckpointTests {
    /// Two checkpointers on one queue file, as two processes have (the file is mapped twice).
    @Test("the plan: one claim at a time, a restart once overlapping checkpoints leave a short tail, a reset when the WAL starts over")
    func plan() throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let queueA = try TicketLock(container, name: "database/plan.queue")
        let queueB = try TicketLock(container, name: "database/plan.queue")
        let a = Checkpointer(pages: 100, queue: queueA)
        let b = Checkpointer(pages: 100, queue: queueB)

        a.noteCommit(frames: 99)
        #expect(a.plan() == .none)
        a.noteCommit(frames: 100)
        #expect(a.plan() == .checkpoint(claimed: 100))
        // While A's checkpoint runs (claimed, not finished), B does not claim another one.
        b.noteCommit(frames: 190)
        #expect(b.plan() == .none)
        a.finishCheckpoint(claimed: 100)
        #expect(queueB.progress == 100 << 32 | 100)
        // 90 frames past the checkpoint: too long a tail for a cheap restart.
        #expect(b.plan() == .none)
        b.noteCommit(frames: 200)
        #expect(b.plan() == .checkpoint(claimed: 200))
        b.finishCheckpoint(claimed: 200)
        // Two cycles, and a short tail: restart in the turn.
        a.noteCommit(frames: 220)
        #expect(a.plan() == .restart)
        // A restart that failed (a reader of an old snapshot) waits for a quarter cycle more.
        a.restartFailed()
        a.noteCommit(frames: 224)
        #expect(a.plan() == .none)
        // Three cycles: restart whatever the tail (100 frames here), before claiming anything: a
        // disk slower than the writers makes long tails, and checkpoints that always run would
        // keep every restart from SQLite's checkpoint lock.
        a.noteCommit(frames: 299)
        #expect(a.plan() == .none)
        a.noteCommit(frames: 300)
        #expect(a.plan() == .restart)
        // A failed one (another process's checkpoint held the lock): checkpoints go on, and
        // the restart is tried again a quarter cycle later, even while one runs.
        a.restartFailed()
        #expect(a.plan() == .checkpoint(claimed: 300))
        a.noteCommit(frames: 324)
        #expect(a.plan() == .none)
        a.noteCommit(frames: 325)
        #expect(a.plan() == .restart)
        // The WAL started over (B sees it first): the progress was about the old frames, and
        // A's put-off restart too.
        b.noteCommit(frames: 2)
        #expect(b.plan() == .none)
        #expect(queueA.progress == 0)
        // A checkpoint whose writer is slow, stopped or dead holds the others back for one
        // cycle at most; it does not record its end over a newer claim.
        a.noteCommit(frames: 100)
        #expect(a.plan() == .checkpoint(claimed: 100))
        b.noteCommit(frames: 199)
        #expect(b.plan() == .none)
        b.noteCommit(frames: 200)
        #expect(b.plan() == .checkpoint(claimed: 200))
        a.finishCheckpoint(claimed: 100)
        #expect(queueA.progress == 200 << 32 | 0)
        b.finishCheckpoint(claimed: 200)
        #expect(queueA.progress == 200 << 32 | 200)
        b.noteCommit(frames: 1)
        #expect(b.plan() == .none)
        #expect(queueA.progress == 0)
    }

    @Test("a lone writer hands its turn on before it checkpoints, and its WAL starts over again and again")
    func loneWriterCheckpointsOutsideItsTurn() async throws {
        let directory = try TemporaryContainer()
        let database = try await Self.loneWriter(directory)
        let (longestWAL, restarts, handedOn) = try await Self.writeRows(database, count: 500)
        #expect(handedOn >= 10, "checkpoints that handed the turn on: \(handedOn)")
        #expect(restarts >= 5, "WAL restarts: \(restarts)")
        // SQLite's automatic checkpoint is replaced, and a passive checkpoint with no other
        // writer covers the whole WAL, so SQLite starts it over at the next commit.
        print("lone writer: longest WAL \(longestWAL) frames, \(restarts) restarts, \(handedOn) hand-offs")
        // The checkpoint thread runs while the writer goes on committing, so the WAL grows
        // past a cycle while it syncs; from three cycles on each commit waits for it (10 ms at
        // most), and the first that finds it over starts the WAL over (73-98 frames in runs
        // here for 32-page cycles; 274-952 beside two processes that write and fsync 8 MB in a
        // loop before that bound; about 1,000 if nothing started the WAL over). The next test
        // makes every checkpoint slow.
        #expect(longestWAL <= 32 * 4, "longest WAL: \(longestWAL) frames")
        #expect(try await count(database) == 500)
    }

    @Test("a lone writer on a disk slower than its commits: at three cycles its commits wait for its checkpoint outside its turn and the WAL starts over, however long each checkpoint takes")
    func slowCheckpointsDoNotLetTheWALGrow() async throws {
        let directory = try TemporaryContainer()
        let database = try await Self.loneWriter(directory)
        // Each sync of the checkpoint thread's connection takes 10 ms more, as on a disk busy
        // with other writes (CI's, where the WAL of the test above once reached 291 frames):
        // the writer fills a cycle faster than a checkpoint ends.
        try #require(SlowSyncVFS.register(delayMicroseconds: 10_000), "registering the slow-sync VFS")
        database.checkpointThread.vfs.withLock { $0 = SlowSyncVFS.name }
        let (longestWAL, restarts, _) = try await Self.writeRows(database, count: 400)
        let slowed = SlowSyncVFS.slowedSyncs.load(ordering: .relaxed)
        print("slow checkpoints: longest WAL \(longestWAL) frames, \(restarts) restarts, \(slowed) slowed syncs")
        #expect(slowed > 0, "no sync of the checkpoint thread was slowed down")
        // Before the bound, every restart found the checkpoint thread holding SQLite's
        // checkpoint lock, and the WAL grew to the 400 commits' whole length (817 frames).
        // Now each commit from three cycles on waits for that checkpoint (after its turn, 10 ms
        // at most), and the first that finds it over restarts: a checkpoint of two syncs of
        // 10 ms and more lets a few commits past the bound (99-101 frames here), not hundreds.
        #expect(restarts >= 5, "WAL restarts: \(restarts)")
        #expect(longestWAL <= 32 * 5, "longest WAL: \(longestWAL) frames")
        #expect(try await count(database) == 400)
    }

    /// Opens a database whose checkpoints are claimed every 32 pages, for one writer (it holds
    /// its container).
    static func loneWriter(_ directory: TemporaryContainer) async throws -> SharedDatabase {
        let container = try SharedContainer(path: directory.path)
        var configuration = SharedDatabase.Configuration()
        configuration.checkpointPages = 32
        let database = try await SharedDatabase.open(at: directory.path + "/app.sqlite", container: container, migrator: TestSchema.migrator(), configuration: configuration)
        return database
    }

    /// Writes `count` rows of writer 1, a write call each, following the WAL after each: its
    /// longest length in frames, how many times it started over, and how many writes handed the
    /// writer queue's turn on (after a write the turn is kept for the next one, except when its
    /// writer checkpointed, or waited for a checkpoint: it handed the turn on first).
    static func writeRows(_ database: SharedDatabase, count: Int) async throws -> (longestWAL: Int, restarts: Int, handedOn: Int) {
        var longestWAL = 0, restarts = 0, handedOn = 0, lastFrames = database.checkpointer.walFrames
        for seq in 0..<count {
            try await database.write { db in
                try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, ?)", arguments: [seq])
            }
            if database.writerQueue.holder != getpid() { handedOn += 1 }
            let frames = database.checkpointer.walFrames
            longestWAL = max(longestWAL, frames)
            if frames < lastFrames { restarts += 1 }
            lastFrames = frames
        }
        return (longestWAL, restarts, handedOn)
    }

    final class Started: Sendable {
        let names = Mutex<[String]>([])
        var all: [String] { names.withLock { $0 } }
    }

    /// A gate that holds checkpoints at their start, opened by the test or, 20 s after the first
    /// checkpoint reached it, by itself (so that a checkpoint held in a write call fails the test
    /// instead of hanging it); `openedByItself` says which.
    ///
    /// The bound counts from the first hold, not from the gate's making (10 s before): a test
    /// that takes 0.6 s alone takes 5 s in an idle full run, and more beside CPU-bound loops.
    /// `claimedCheckpointRunsOutsideTheWriteCall()`'s failure with the WAL at 643 frames (full
    /// runs beside three CPU-bound loops, 2 of 2) was not the gate: its message, which now says
    /// whether the gate opened by itself, said it had not. A write on the fast path waited for
    /// the held checkpoint asleep on a thread of Swift's cooperative pool, and the test's own
    /// 500 ms sleep resumed only after that write's 30 s patience
    /// (`writeBehindAHeldCheckpointLeavesItsThreadFree()`).
    final class Gate: Sendable {
        private let semaphore = DispatchSemaphore(value: 0)
        private let opened = Mutex<(open: Bool, byItself: Bool, timing: Bool)>((false, false, false))

        /// How long after the first hold the gate opens by itself: shorter than the held
        /// databases' `busyTimeout` (30 s), so that a writer held behind the gate fails instead
        /// of outwaiting it.
        static let bound: Duration = .seconds(20)

        func open(byItself: Bool = false) {
            let first = opened.withLock { state -> Bool in
                defer { state.open = true }
                if !state.open { state.byItself = byItself }
                return !state.open
            }
            if first { semaphore.signal() }
        }

        var openedByItself: Bool { opened.withLock { $0.byItself } }

        func pass() {
            let startsTimer = opened.withLock { state -> Bool in
                defer { state.timing = true }
                return !state.timing
            }
            if startsTimer {
                Task { [self] in
                    try? await Task.sleep(for: Self.bound)
                    open(byItself: true)
                }
            }
            semaphore.wait()
            semaphore.signal()
        }
    }

    /// Opens a database whose checkpoints are claimed every 32 pages; the checkpoints from the
    /// `heldFrom`-th on (1: all) wait at their start for `gate`. `started` records the
    /// checkpoints that reached their start, by the name of the thread that ran each.
    static func heldCheckpoints(_ directory: TemporaryContainer, heldFrom: Int = 1, suspensionMode: SharedDatabase.SuspensionMode = .rollsBackWrites, logger: Logger? = nil) async throws -> (SharedDatabase, SharedContainer, gate: Gate, started: Started) {
        let container = try SharedContainer(path: directory.path, logger: logger)
        var configuration = SharedDatabase.Configuration()
        configuration.checkpointPages = 32
        configuration.suspensionMode = suspensionMode
        // A writer that claims behind a held checkpoint waits for it this long at most: longer
        // than the gate stays closed.
        configuration.busyTimeout = .seconds(30)
        let database = try await SharedDatabase.open(at: directory.path + "/app.sqlite", container: container, migrator: TestSchema.migrator(), configuration: configuration)
        let gate = Gate()
        let started = Started()
        database.checkpointer.beforeCheckpoint.withLock {
            $0 = {
                let name = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "?"
                let count = started.names.withLock { names -> Int in
                    names.append(name)
                    return names.count
                }
                if count >= heldFrom { gate.pass() }
            }
        }
        return (database, container, gate, started)
    }

    /// Writes rows of `writer` until `count` checkpoints were claimed (handed to the thread),
    /// then waits until the thread has started them (and holds the last one).
    static func writeUntilStarted(_ count: Int, _ database: SharedDatabase, started: Started) async throws {
        try await writeUntil(database, writer: 1, "\(count) checkpoints claimed") { database.checkpointThread.submittedCount >= count }
        try await eventually("the checkpoint thread starting \(count) checkpoints", within: 30) { started.all.count >= count }
    }

    /// Writes rows of `writer` until `done` holds (60 s at most).
    static func writeUntil(_ database: SharedDatabase, writer: Int, _ what: String, _ done: @escaping @Sendable () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(60)
        var seq = 0
        while !done() {
            guard ContinuousClock.now < deadline else { throw TestFailure("\(what) did not happen within 60 s") }
            let value = seq
            try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (?, ?)", arguments: [writer, value]) }
            seq += 1
        }
    }

    @Test("a claimed checkpoint runs on the checkpoint thread: writes go on while it waits for the disk, until the writers have gone a whole cycle further")
    func claimedCheckpointRunsOutsideTheWriteCall() async throws {
        let directory = try TemporaryContainer()
        let (database, _, gate, started) = try await Self.heldCheckpoints(directory)
        defer { gate.open() }
        try await Self.writeUntilStarted(1, database, started: started)
        // Held at its start, as a disk that stalls its sync would hold it: this process's
        // writes go on meanwhile. (Run in the write call that claimed it, that call would
        // have waited for the gate, which opens by itself 20 s after its first hold.)
        for seq in 0..<5 {
            try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (2, ?)", arguments: [seq]) }
        }
        #expect(!gate.openedByItself, "the writes waited for the held checkpoint")
        #expect(started.all == ["baton-checkpt"])
        // A whole cycle further, the write that claims the next checkpoint waits for the held
        // one: the WAL does not grow while checkpoints queue up behind a stalled disk.
        let writes = Task {
            for seq in 0..<300 {
                try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (3, ?)", arguments: [seq]) }
            }
        }
        try await Task.sleep(for: .milliseconds(500))
        let frames = database.checkpointer.walFrames
        #expect(frames <= 32 * 3, "the WAL grew to \(frames) frames behind the held checkpoint (the gate opened by itself: \(gate.openedByItself))")
        #expect(started.all.count == 1)
        gate.open()
        try await writes.value
        #expect(!gate.openedByItself)
        // Let go, it covers the WAL, and the next checkpoints run there too.
        try await Self.writeUntil(database, writer: 4, "more checkpoints") { started.all.count >= 3 }
        #expect(started.all.allSatisfy { $0 == "baton-checkpt" }, "\(started.all)")
        #expect(database.checkpointThread.unavailableReason == nil)
        // They copied the WAL's frames into the database (a connection that has not read the
        // database yet does nothing and says SQLITE_OK, with -1 frames). One that runs just
        // after the writer started the WAL over finds it empty; one that meets another
        // checkpoint says SQLITE_BUSY.
        let results = database.checkpointThread.results
        #expect(results.allSatisfy { [SQLITE_OK, SQLITE_BUSY].contains($0.code & 0xff) }, "\(results)")
        #expect(results.filter { $0.log > 0 && $0.done > 0 }.count >= 2, "\(results)")
        let integrity = try await database.read { db in try String.fetchOne(db, sql: "PRAGMA integrity_check") }
        #expect(integrity == "ok")
        #expect(try await count(database) >= 305)
    }

    /// A `TaskExecutor` on one serial dispatch queue: while a job blocks the queue's thread, no
    /// other job of the executor runs.
    final class SerialQueueExecutor: TaskExecutor, @unchecked Sendable {
        // @unchecked: the queue is set once and is itself thread-safe.
        private let queue = DispatchQueue(label: "test-serial-executor")

        func enqueue(_ job: consuming ExecutorJob) {
            let job = UnownedJob(job)
            queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
        }
    }

    @Test("a write made on its task's thread that must wait for this process's held checkpoint waits suspended: its executor runs other jobs meanwhile")
    func writeBehindAHeldCheckpointLeavesItsThreadFree() async throws {
        let directory = try TemporaryContainer()
        let (database, _, gate, started) = try await Self.heldCheckpoints(directory)
        defer { gate.open() }
        try await Self.writeUntilStarted(1, database, started: started)
        let submitted = database.checkpointThread.submittedCount
        // Writes on an executor of one thread (the fast path: nobody else writes) until one
        // claims the next checkpoint, a whole cycle further, and waits for the held one.
        let executor = SerialQueueExecutor()
        let writes = Task(executorPreference: executor) {
            for seq in 0..<300 {
                try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (3, ?)", arguments: [seq]) }
            }
        }
        try await eventually("a write claiming the next checkpoint", within: 30) { database.checkpointThread.submittedCount > submitted }
        // Asleep on the executor's thread, that write would keep this job from running until
        // its patience (the held database's busyTimeout, 30 s) ran out.
        let ran = Mutex(false)
        let probe = Task(executorPreference: executor) { ran.withLock { $0 = true } }
        try await eventually("a job on the writing task's executor running while the write waits", within: 10) { ran.withLock { $0 } }
        #expect(started.all.count == 1, "the held checkpoint was let go before the job ran")
        #expect(database.checkpointer.walFrames <= 32 * 3, "the write did not wait: the WAL grew to \(database.checkpointer.walFrames) frames")
        gate.open()
        try await writes.value
        await probe.value
        #expect(!gate.openedByItself)
        #expect(try await count(database) >= 300)
    }

    @Test("a database the checkpoint thread cannot open has its checkpoints run in the writer's call, and says why")
    func checkpointsRunInTheCallWhenTheThreadCannotOpen() async throws {
        let directory = try TemporaryContainer()
        let (logger, log) = CapturingLogHandler.logger()
        let (database, _, gate, started) = try await Self.heldCheckpoints(directory, logger: logger)
        gate.open()
        // The database's directory moves before the first claim: the connections already open
        // go on, but the thread's connection, opened on that claim by path, cannot be.
        let moved = directory.path + "-moved"
        try FileManager.default.moveItem(atPath: directory.path, toPath: moved)
        defer { try? FileManager.default.moveItem(atPath: moved, toPath: directory.path) }
        try await Self.writeUntil(database, writer: 1, "two checkpoints") { started.all.count >= 2 }
        let reason = try #require(database.checkpointThread.unavailableReason)
        #expect(reason.contains("opening a connection of its own failed"), "\(reason)")
        #expect(log.events.filter { $0 == "checkpoints_in_writer_calls" }.count == 1, "\(log.messages)")
        // The first claim reached the thread, which could not open (that checkpoint is skipped:
        // its claim expires a cycle later); the next ones ran in the writers' calls.
        #expect(!started.all.contains("baton-checkpt"), "\(started.all)")
        #expect(database.checkpointThread.results.isEmpty)
    }

    @Test("a suspension waits for a running checkpoint (cut short), then holds no lock of the database; checkpoints resume after")
    func suspensionWaitsForTheCheckpointThread() async throws {
        let directory = try TemporaryContainer()
        // Connections closed by the suspension: then no lock at all may stay, the checkpoint
        // thread's connection's included (which ran one whole checkpoint first: idle, it holds
        // what an idle WAL connection holds).
        let (database, container, gate, started) = try await Self.heldCheckpoints(directory, heldFrom: 2, suspensionMode: .closesConnections)
        defer { gate.open() }
        try await Self.writeUntilStarted(2, database, started: started)
        let suspended = Started()
        let suspension = Task {
            await container.suspend()
            suspended.names.withLock { $0.append("suspended") }
        }
        // The checkpoint is one of the database's operations: the suspension waits for it.
        try await Task.sleep(for: .milliseconds(300))
        #expect(suspended.all.isEmpty, "the suspension did not wait for the running checkpoint")
        gate.open()
        await suspension.value
        #expect(ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true).isEmpty,
                "locks after suspend: \(ProcLocks.files(lockedBy: getpid(), under: directory.path))")
        try await container.resume()
        let before = started.all.count
        try await Self.writeUntil(database, writer: 4, "a checkpoint after the resume") { started.all.count > before }
        #expect(started.all.allSatisfy { $0 == "baton-checkpt" }, "\(started.all)")
        let integrity = try await database.read { db in try String.fetchOne(db, sql: "PRAGMA integrity_check") }
        #expect(integrity == "ok")
    }

    @Test("a database released while its checkpoint runs is gone once that checkpoint's connection is closed; a new database made at once at the same path keeps its rows")
    func releasedDatabaseLeavesNoConnectionOpen() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let (opened, container, gate, started) = try await Self.heldCheckpoints(directory)
        defer { gate.open() }
        try await Self.writeUntilStarted(1, opened, started: started)
        // The checkpoint thread holds its connection open in a checkpoint, which the disk (here
        // the gate) ends 300 ms from now.
        let ending = Task {
            try await Task.sleep(for: .milliseconds(300))
            gate.open()
        }
        _ = consume opened // its last reference
        // Before, the release returned at once and the thread closed its connection when the
        // checkpoint ended: 3 descriptors of the database and 1 of its WAL were still open here.
        #expect(openDescriptors(on: path) == 0, "a connection of the released database is still open")
        #expect(openDescriptors(on: path + "-wal") == 0, "the released database's WAL is still open")
        try await ending.value
        #expect(!gate.openedByItself)
        // An app that deletes its database once it let go of it and makes a new one at once:
        // the new one's rows are all there for a connection opened by the path.
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
        let fresh = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator())
        try await fresh.write { db in
            for seq in 0..<10 { try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (3, ?)", arguments: [seq]) }
        }
        let other = try DatabaseQueue(path: path)
        let rows = try await other.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM item WHERE writer = 3") }
        #expect(rows == 10)
        try other.close()
        withExtendedLifetime(fresh) {}
    }

    @Test("4 writer processes whose checkpoints overlap their commits keep the WAL short")
    func overlappingCheckpointsKeepTheWALShort() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        // The size bound (a RESTART that waits for readers) is set out of reach: only the
        // restarts of the checkpoint plan keep the WAL short.
        let writers = try (1...4).map { writer in
            try ChildProcess(harness: [
                "db-test", "write", path, "--count", "2000", "--writer", "\(writer)",
                "--checkpoint-pages", "64", "--wal-restart-size", "\(256 << 20)",
            ], container: directory.path)
        }
        for child in writers {
            #expect(try await child.wait(timeout: 120) == 0, "writer said: \(child.lines)")
        }
        let container = try SharedContainer(path: directory.path)
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator())
        #expect(try await count(database) == 8_000)
        // 8,000 commits without restarts would make a WAL of 8,000 frames (33 MB).
        let wal = try walSize(path)
        #expect(wal <= 8 << 20, "WAL is \(wal) bytes")
        let integrity = try await database.read { db in try String.fetchOne(db, sql: "PRAGMA integrity_check") }
        #expect(integrity == "ok")
    }
}
