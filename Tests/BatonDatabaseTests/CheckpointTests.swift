import Baton
@testable import BatonDatabase
import BatonFixtures
import Foundation
import GRDB
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
        a.noteCommit(frames: 300)
        #expect(a.plan() == .checkpoint(claimed: 300))
        a.finishCheckpoint(claimed: 300)
        a.noteCommit(frames: 310)
        #expect(a.plan() == .restart)
        // The WAL started over (B sees it first): the progress was about the old frames, and
        // A's put-off restart too.
        b.noteCommit(frames: 2)
        #expect(b.plan() == .none)
        #expect(queueA.progress == 0)
        // Past three cycles, restart whatever the tail (a slow disk makes long ones).
        a.noteCommit(frames: 100)
        #expect(a.plan() == .checkpoint(claimed: 100))
        a.finishCheckpoint(claimed: 100)
        a.noteCommit(frames: 200)
        #expect(a.plan() == .checkpoint(claimed: 200))
        a.finishCheckpoint(claimed: 200)
        a.noteCommit(frames: 290)
        #expect(a.plan() == .none)
        a.noteCommit(frames: 300)
        #expect(a.plan() == .checkpoint(claimed: 300))
        a.finishCheckpoint(claimed: 300)
        a.noteCommit(frames: 360)
        #expect(a.plan() == .restart)
        // A checkpoint whose writer is slow, stopped or dead holds the others back for one
        // cycle at most; it does not record its end over a newer claim.
        a.noteCommit(frames: 400)
        #expect(a.plan() == .checkpoint(claimed: 400))
        b.noteCommit(frames: 499)
        #expect(b.plan() == .none)
        b.noteCommit(frames: 500)
        #expect(b.plan() == .checkpoint(claimed: 500))
        a.finishCheckpoint(claimed: 400)
        #expect(queueA.progress == 500 << 32 | 300)
        b.finishCheckpoint(claimed: 500)
        #expect(queueA.progress == 500 << 32 | 500)
        b.noteCommit(frames: 1)
        #expect(b.plan() == .none)
        #expect(queueA.progress == 0)
    }

    @Test("a lone writer hands its turn on before it checkpoints, and its WAL starts over every checkpoint")
    func loneWriterCheckpointsOutsideItsTurn() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let container = try SharedContainer(path: directory.path)
        var configuration = SharedDatabase.Configuration()
        configuration.checkpointPages = 32
        let database = try await SharedDatabase.open(at: path, container: container, migrator: TestSchema.migrator(), configuration: configuration)
        var handedOn = 0, longestWAL = 0, restarts = 0, lastFrames = 0
        for seq in 0..<500 {
            try await database.write { db in
                try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, ?)", arguments: [seq])
            }
            // After a write the turn is kept for the next one, except after the write whose
            // writer checkpointed: it handed the turn on first.
            if database.writerQueue.holder != getpid() { handedOn += 1 }
            let frames = database.checkpointer.walFrames
            longestWAL = max(longestWAL, frames)
            if frames < lastFrames { restarts += 1 }
            lastFrames = frames
        }
        #expect(handedOn >= 10, "checkpoints that handed the turn on: \(handedOn)")
        #expect(restarts >= 10, "WAL restarts: \(restarts)")
        // SQLite's automatic checkpoint is replaced, and a passive checkpoint with no other
        // writer covers the whole WAL, so SQLite starts it over at the next commit.
        #expect(longestWAL <= 32 + 4, "longest WAL: \(longestWAL) frames")
        #expect(try await count(database) == 500)
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
