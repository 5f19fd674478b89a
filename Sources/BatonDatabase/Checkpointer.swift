import Baton
import GRDB
import GRDBSQLite
import Synchronization

/// The shared database's WAL checkpoints, run by its writers mostly outside their turn in the
/// writer queue.
///
/// SQLite's automatic checkpoint runs inside the `COMMIT` that crosses `wal_autocheckpoint`. With
/// `synchronous = NORMAL` it syncs the WAL (a thousand dirty pages) and then the database file:
/// about 4 ms on the machines here, a fifth of a lone writer's time. Run there, it would hold the
/// writer queue, and every writer of every process would wait for the disk.
///
/// So the writer connection's WAL hook (which replaces SQLite's automatic checkpoint) only counts
/// the WAL's frames, and a word in the writer queue's file (``TicketLock/progress``) says what the
/// last checkpoint of any process covered. After each commit, its writer, still holding its turn,
/// looks at both (``plan()``):
/// - ``SharedDatabase/Configuration/checkpointPages`` frames are not checkpointed yet, and no
///   checkpoint runs: the writer claims the checkpoint, hands its turn on, and gives it to its
///   process's ``CheckpointThread``, which runs a `PASSIVE` checkpoint on a connection of its own
///   while the writers of every process go on committing (the writer's own call returns at once:
///   it no longer waits for the disk's sync, 4 ms here and now and then hundreds, unless its
///   process's writers have gone a whole cycle past a checkpoint still running). A database
///   the thread cannot open has it run in the writer's call (``checkpoint(_:claimed:)``).
/// - A checkpoint that overlapped commits leaves a tail, so SQLite cannot start the WAL over by
///   itself. Once the WAL holds ``restartCycles`` × `checkpointPages` frames and the tail is
///   short, the writer runs a `RESTART` checkpoint in its turn (``restart(_:tryOnce:)``): it
///   syncs only the tail (about 1 ms here), and the next commit starts the WAL over.
/// - The bound: at ``restartCycles`` + 1 cycles the writer restarts whatever the tail, before it
///   claims anything. When its process's checkpoint thread runs a checkpoint then (which holds
///   SQLite's checkpoint lock), the writer hands its turn on and waits for that checkpoint
///   outside the turn, ``restartWaitLimit`` at most (``Plan/awaitCheckpoint``: the other
///   processes' writers go on; a commit that finds it still running waits again), and the next
///   commit restarts. A disk slower than the writers (each checkpoint longer than a
///   quarter cycle of commits) would otherwise have every restart find that lock taken, and the
///   WAL would grow for as long as the disk stays slow: 817 frames of 32-page cycles in a test
///   whose checkpoint syncs take 10 ms more, 274-952 under fsync load, where now it peaks at 3
///   cycles and a few commits (99-101 frames in that test). A writer that claims a checkpoint
///   while one of its process's is still running waits for that one too
///   (``handOff(_:on:thread:patience:)``).
///
/// The restart tries SQLite's locks once: a reader of an old snapshot, or another process's
/// checkpoint, makes it give up until the WAL has grown by another quarter of
/// `checkpointPages` (passive checkpoints go on meanwhile). The shared database's size bound, a
/// `RESTART` that waits for readers, stays behind it.
///
/// Measured with 4 writer processes on 2 cores: the overlapped checkpoints make them together
/// faster than one writer alone, where the in-turn checkpoint made them 10 % slower.
///
/// The progress word is `claimed << 32 | checkpointed`, in frames: a checkpoint runs while
/// `claimed > checkpointed`. It only schedules checkpoints: a claim a whole cycle old (its writer
/// is slow, stopped or dead) no longer holds the others back, and a checkpoint that finds another
/// one running (SQLite's checkpoint lock) gives up at once.
final class Checkpointer: Sendable {
    /// What the writer does after a commit.
    enum Plan: Equatable {
        /// Nothing; keep the turn.
        case none
        /// Hand the turn on, then ``checkpoint(_:claimed:)`` (the checkpoint is claimed).
        case checkpoint(claimed: UInt32)
        /// ``restart(_:tryOnce:)`` now, in the turn.
        case restart
        /// A restart is due, but this process's ``CheckpointThread`` runs a checkpoint, which
        /// holds SQLite's checkpoint lock that a restart only tries once: hand the turn on,
        /// then wait for that checkpoint (see ``runAfterTurn(_:on:thread:patience:)``); the next
        /// commit restarts.
        case awaitCheckpoint

        /// Whether the writer hands its turn on after this commit (to checkpoint, or to wait
        /// for one).
        var handsTurnOn: Bool {
            switch self {
            case .checkpoint, .awaitCheckpoint: true
            case .none, .restart: false
            }
        }
    }

    /// Checkpoint cycles between two restarts of the WAL (one restart per cycle would cost the
    /// writers twice the time in their turns; more cycles make the WAL longer).
    static let restartCycles: UInt32 = 2

    /// How long a write call waits, at most, for its process's checkpoint at the WAL's bound
    /// (``Plan/awaitCheckpoint``). A checkpoint takes about 4 ms on the disks here; one that
    /// the disk stalls (56-272 ms seen with 4 writer processes) would otherwise stall that call
    /// as long. Each commit at the bound waits again while the checkpoint runs, which holds the
    /// process's writers to one commit per wait, and the WAL nearly still.
    static let restartWaitLimit: Duration = .milliseconds(10)

    /// Frames in the WAL after the last commit of the writer connection (its WAL hook).
    private let frames = Atomic<Int>(0)
    /// The database's page size (read when the hook is installed).
    private let pageSize = Atomic<Int>(4096)
    /// A failed restart is tried again once the WAL holds this many frames.
    private let restartRetry = Atomic<Int>(0)
    private let pages: UInt32
    private let queue: TicketLock

    /// - Parameters:
    ///   - pages: Frames between two checkpoints.
    ///   - queue: The writer queue, whose ``TicketLock/progress`` word is shared progress.
    init(pages: Int, queue: TicketLock) {
        self.pages = UInt32(clamping: max(pages, 1))
        self.queue = queue
    }

    /// Installs the WAL hook on the writer connection `db`, in place of SQLite's automatic
    /// checkpoint. The checkpointer must outlive the connection (the shared database owns both).
    func install(on db: Database) {
        if let size = try? Int.fetchOne(db, sql: "PRAGMA page_size") { pageSize.store(size, ordering: .relaxed) }
        let context = Unmanaged.passUnretained(self).toOpaque()
        sqlite3_wal_hook(db.sqliteConnection, { context, _, _, frames in
            if let context {
                Unmanaged<Checkpointer>.fromOpaque(context).takeUnretainedValue().noteCommit(frames: Int(frames))
            }
            return SQLITE_OK
        }, context)
    }

    /// Frames in the WAL after this process's last commit.
    var walFrames: Int { frames.load(ordering: .relaxed) }

    /// The WAL's length in bytes after this process's last commit (header and frames).
    var walBytes: Int { 32 + walFrames * (pageSize.load(ordering: .relaxed) + 24) }

    /// Records the WAL's length after a commit of the writer connection (its WAL hook).
    func noteCommit(frames count: Int) {
        frames.store(count, ordering: .relaxed)
    }

    /// Called after a commit, holding the turn.
    func plan() -> Plan {
        let frames = UInt32(clamping: walFrames)
        var word = queue.progress
        if frames < UInt32(truncatingIfNeeded: word >> 32) || frames < UInt32(truncatingIfNeeded: word) {
            // The WAL started over since: that progress was about the frames of before.
            guard queue.updateProgress(from: word, to: 0) else { return .none }
            word = 0
            restartRetry.store(0, ordering: .relaxed)
        }
        if Int(frames) + Int(pages / 4) < restartRetry.load(ordering: .relaxed) {
            // Put off in a WAL that started over since (seen by another process first).
            restartRetry.store(0, ordering: .relaxed)
        }
        let claimed = UInt32(truncatingIfNeeded: word >> 32), checkpointed = UInt32(truncatingIfNeeded: word)
        let retryReached = Int(frames) >= restartRetry.load(ordering: .relaxed)
        // The bound: past one more cycle, restart whatever the tail, before claiming anything
        // (checkpoints that each sync longer than the writers take to fill a quarter cycle would
        // otherwise keep every restart from its lock, and the WAL would grow for as long as the
        // disk is slow: 952 frames of 32-page cycles under fsync load, before this rule).
        if frames >= pages &* (Self.restartCycles + 1), retryReached { return .restart }
        // One runs, unless it was claimed a whole cycle ago: its writer is slow (a loaded
        // machine), stopped or dead, and the WAL must not wait for it.
        if claimed > checkpointed, frames - claimed < pages { return .none }
        let tail = frames - checkpointed
        if tail >= pages {
            guard queue.updateProgress(from: word, to: UInt64(frames) << 32 | UInt64(checkpointed)) else { return .none }
            return .checkpoint(claimed: frames)
        }
        // A short tail makes a cheap restart.
        if checkpointed > 0, frames >= pages &* Self.restartCycles, tail <= pages / 4, retryReached {
            return .restart
        }
        return .none
    }

    /// What a writer waits for after its turn: until its process's checkpoint thread has
    /// finished with the first `claims` claims (or stopped), `patience` at most.
    struct AfterTurnWait: Equatable {
        var claims: UInt64
        var patience: Duration
        /// A restart's wait (``Plan/awaitCheckpoint``), traced as such.
        var beforeRestart: Bool
    }

    /// Does what `plan` needs of the connection `db` once the turn was handed on: hands the
    /// checkpoint it claimed to `thread`, or runs it here when the thread cannot. Returns what
    /// the writer then waits for, if anything:
    /// - after a claim, an earlier checkpoint of this process that is not finished, `patience`
    ///   at most (the writers went a whole cycle further while it ran: a process whose writers
    ///   outpace the disk is held back as SQLite holds back a writer that checkpoints in its
    ///   `COMMIT`, and its WAL stays near two cycles long, instead of growing while the
    ///   checkpoints queue up; the other processes' writers are not held back);
    /// - before a restart, the checkpoint `thread` runs, ``restartWaitLimit`` at most, so that
    ///   the next commit can restart the WAL.
    ///
    /// The queued write path waits asleep, on GRDB's writer queue (``runAfterTurn(_:on:thread:patience:)``);
    /// a write made on its caller's thread (a task's, in the fast path) waits suspended
    /// (``wait(for:on:)-async``): asleep there, it would hold a thread of Swift's cooperative
    /// pool up to `busyTimeout` behind a checkpoint a slow disk holds.
    func handOff(_ plan: Plan, on db: Database, thread: CheckpointThread, patience: Duration) -> AfterTurnWait? {
        switch plan {
        case .checkpoint(let claimed):
            guard let behind = thread.hand(claimed: claimed) else {
                checkpoint(db, claimed: claimed)
                return nil
            }
            return behind > 0 ? AfterTurnWait(claims: behind, patience: patience, beforeRestart: false) : nil
        case .awaitCheckpoint:
            return AfterTurnWait(claims: thread.submittedCount, patience: min(patience, Self.restartWaitLimit), beforeRestart: true)
        case .none, .restart:
            return nil
        }
    }

    /// ``handOff(_:on:thread:patience:)``, then its wait, asleep on this thread.
    func runAfterTurn(_ plan: Plan, on db: Database, thread: CheckpointThread, patience: Duration) {
        if let wait = handOff(plan, on: db, thread: thread, patience: patience) { self.wait(for: wait, on: thread) }
    }

    /// Makes the wait ``handOff(_:on:thread:patience:)`` returned, asleep on this thread.
    func wait(for wait: AfterTurnWait, on thread: CheckpointThread) {
        if wait.beforeRestart { handOverTrace("ckpt.await") }
        thread.waitUntilFinished(wait.claims, patience: wait.patience)
        if wait.beforeRestart { handOverTrace("ckpt.awaited") }
    }

    /// Makes the wait ``handOff(_:on:thread:patience:)`` returned, suspended (or until the
    /// task is cancelled).
    func wait(for wait: AfterTurnWait, on thread: CheckpointThread) async {
        if wait.beforeRestart { handOverTrace("ckpt.await") }
        await thread.waitUntilFinished(wait.claims, patience: wait.patience)
        if wait.beforeRestart { handOverTrace("ckpt.awaited") }
    }

    /// Called just before each claimed `PASSIVE` checkpoint, on the thread that runs it (tests
    /// hold a checkpoint there).
    let beforeCheckpoint = Mutex<(@Sendable () -> Void)?>(nil)

    /// Runs the claimed `PASSIVE` checkpoint in the writer's call (after the turn was handed
    /// on; when ``CheckpointThread`` cannot run it), then records that the frames up to
    /// `claimed` were tried: a checkpoint that readers of old snapshots cut short is not tried
    /// again before `checkpointPages` more frames.
    func checkpoint(_ db: Database, claimed: UInt32) {
        beforeCheckpoint.withLock { $0 }?()
        var log: Int32 = 0, done: Int32 = 0
        _ = sqlite3_wal_checkpoint_v2(db.sqliteConnection, nil, SQLITE_CHECKPOINT_PASSIVE, &log, &done)
        finishCheckpoint(claimed: claimed)
    }

    /// Records that the checkpoint claimed at `claimed` frames is over.
    func finishCheckpoint(claimed: UInt32) {
        let word = queue.progress
        // Unless the WAL started over meanwhile (the word was reset, or claimed anew).
        if UInt32(truncatingIfNeeded: word >> 32) == claimed {
            queue.updateProgress(from: word, to: UInt64(claimed) << 32 | UInt64(claimed))
        }
    }

    /// Runs a `RESTART` checkpoint in the turn, trying SQLite's locks once (`tryOnce` is set
    /// meanwhile, for the busy handler). When it fails, the next restart is put off.
    func restart(_ db: Database, tryOnce: InterruptionFlag) {
        var log: Int32 = 0, done: Int32 = 0
        tryOnce.set(true)
        let code = sqlite3_wal_checkpoint_v2(db.sqliteConnection, nil, SQLITE_CHECKPOINT_RESTART, &log, &done)
        tryOnce.set(false)
        if code != SQLITE_OK || log != done { restartFailed() }
    }

    /// Puts off the next restart until the WAL has grown by a quarter of `checkpointPages`.
    func restartFailed() {
        restartRetry.store(walFrames + Int(pages / 4), ordering: .relaxed)
    }
}
