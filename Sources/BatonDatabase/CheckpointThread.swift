import Baton
import CBatonShims
import GRDB
import GRDBSQLite
import Synchronization

/// The claimed `PASSIVE` checkpoints of one shared database, run on a connection and a thread
/// of their own, so that no write call waits for them.
///
/// A checkpoint copies the WAL's pages into the database file and syncs both: about 4 ms on
/// the machines here, and as long as the disk takes to sync when it stalls (one took 416 ms
/// in a benchmark run). The writer that claims it (``Checkpointer/plan()``) hands its turn on
/// first, so the other writers do not wait; run inside that writer's own call, though, it made
/// that call the slowest of the run. Here the call returns at once, and the checkpoint runs
/// while this process and the others go on committing (a `PASSIVE` checkpoint takes no lock a
/// writer needs), unless the writers of this process have gone a whole cycle past a checkpoint
/// that is still running: the writer that claims the next one waits for it (see
/// ``Checkpointer/handOff(_:on:thread:patience:)``). The in-turn `RESTART` of a short tail stays with the writer.
///
/// The connection is opened on the first claim, read-write, with the SQLite library GRDB uses
/// (GRDBSQLite: one library's bookkeeping of the process's POSIX locks, so that closing one
/// connection never releases another's), and holds no lock between checkpoints but what an
/// idle WAL connection holds. A database this connection cannot work on (it cannot be opened,
/// or its checkpoint fails for another reason than a busy lock or an interruption: an
/// encrypted database whose key only GRDB's connections get, say) has its checkpoints run in
/// the writer's call, as before, from then on.
///
/// Suspension: a checkpoint counts as an operation of the database (``SharedDatabase``'s
/// suspension waits for it, after interrupting it), none starts while the database is
/// suspended (its claim is left to expire: ``Checkpointer/plan()``), and the connection is
/// closed with the suspension and opened again on the next claim.
final class CheckpointThread: @unchecked Sendable {
    // @unchecked: `word` and `progress` are private memory touched only with atomics and
    // ``AddressWait``; everything else mutable is in `state` (a Mutex).
    /// What the thread needs from its database, without holding it.
    struct Hooks: Sendable {
        /// Counts a checkpoint as an operation of the database; `false` while it is suspended
        /// or gone (the checkpoint is skipped).
        var begin: @Sendable () -> Bool
        /// Ends what `begin` counted.
        var end: @Sendable () -> Void
        /// Says, once, why checkpoints run in the writers' calls from now on.
        var report: @Sendable (String) -> Void
    }

    /// The thread's SQLite connection (`SQLITE_OPEN_NOMUTEX`: only the thread uses it, and
    /// ``interrupt()``, which SQLite allows from any thread).
    private struct Connection: @unchecked Sendable {
        let handle: OpaquePointer
    }

    private struct State {
        var connection: Connection?
        /// Whether checkpoints run in the writer's call (see the type's notes), and why.
        var unavailable: String?
        var claims: [UInt32] = []
        /// Claims handed over, and claims the thread has finished with (run or skipped).
        var submitted: UInt64 = 0
        var finished: UInt64 = 0
        /// Whether the thread is started (it stays until ``stop()``).
        var started = false
        /// Whether the thread has ended, its connection closed.
        var exited = false
        /// Whether a checkpoint runs on the connection now.
        var running = false
        var stopped = false
        /// Set once, by the database (``attach(_:)``).
        var hooks: Hooks?
        /// What the last checkpoints returned (``resultsKept`` at most): SQLite's code, the
        /// WAL's frames and those in the database (for tests).
        var checkpoints: [(code: Int32, log: Int32, done: Int32)] = []
    }

    /// How many checkpoint results are kept (for tests; a long-running process must not grow).
    static let resultsKept = 64

    private let path: String
    private let checkpointer: Checkpointer
    private let state = Mutex(State())
    /// The thread's wait word: moved by every claim and by ``stop()``.
    private let word: UnsafeMutablePointer<UInt32>
    /// Moved whenever the thread finishes with a claim (and by ``stop()``): what a writer that
    /// claimed behind an unfinished checkpoint waits on.
    private let progress: UnsafeMutablePointer<UInt32>

    init(path: String, checkpointer: Checkpointer) {
        self.path = path
        self.checkpointer = checkpointer
        word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
        word.initialize(to: 0)
        progress = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
        progress.initialize(to: 0)
    }

    deinit {
        // The thread holds this object while it runs: it has ended (``stop()``).
        if let connection = state.withLock({ $0.connection }) { sqlite3_close_v2(connection.handle) }
        word.deallocate()
        progress.deallocate()
    }

    /// Sets what the thread asks its database (before the first ``hand(claimed:)``).
    func attach(_ hooks: Hooks) {
        state.withLock { $0.hooks = hooks }
    }

    /// The name of the SQLite VFS the thread's connection is opened with (`nil`: the default);
    /// read at each opening. For tests, which slow its syncs down as a busy disk does.
    let vfs = Mutex<String?>(nil)

    /// How many claims were handed to the thread.
    var submittedCount: UInt64 { state.withLock { $0.submitted } }

    /// What the last checkpoints run here returned, oldest first (for tests).
    var results: [(code: Int32, log: Int32, done: Int32)] { state.withLock { $0.checkpoints } }

    /// Why checkpoints run in the writer's call, if they do (for diagnostics and tests).
    var unavailableReason: String? { state.withLock { $0.unavailable } }

    /// Hands the checkpoint claimed at `claimed` frames to the thread without waiting. Returns
    /// how many claims were handed over before it (the caller may then wait until the thread
    /// has finished those: ``Checkpointer/handOff(_:on:thread:patience:)``), or `nil` when it
    /// must run in the caller's call (this database's checkpoints cannot run here, or the
    /// thread was stopped).
    func hand(claimed: UInt32) -> UInt64? {
        let submission = state.withLock { state -> (start: Bool, behind: UInt64)? in
            guard state.unavailable == nil, !state.stopped, state.hooks != nil else { return nil }
            state.claims.append(claimed)
            state.submitted += 1
            defer { state.started = true }
            return (!state.started, state.submitted - 1)
        }
        guard let submission else { return nil }
        if submission.start { KernelThread.spawn(name: "baton-checkpt") { [self] in run() } }
        baton_add32(word, 1)
        AddressWait.wakeOne(word)
        return submission.behind
    }

    /// Whether the thread has claims it has not finished with (one runs, or waits to).
    var isBusy: Bool { state.withLock { $0.finished < $0.submitted && !$0.stopped } }

    /// Sleeps until the thread has finished with the first `count` claims (or stopped), for
    /// `patience` at most. (A writer whose restart of the WAL is due waits here, outside its
    /// turn, for every claim handed over so far: the checkpoint lock this thread holds.)
    func waitUntilFinished(_ count: UInt64, patience: Duration) {
        waitForProgress(deadline: baton_monotonic_ns() &+ UInt64(clamping: patience.nanoseconds)) { $0.finished >= count || $0.stopped }
    }

    /// ``waitUntilFinished(_:patience:)`` for a task: suspends (no thread waits) until the
    /// thread has finished with the first `count` claims (or stopped), for `patience` at most,
    /// or until the task is cancelled. A write made on a task's own thread waits here: asleep
    /// on that thread, it would hold one of the few threads of Swift's cooperative pool, up to
    /// `busyTimeout`, behind a checkpoint that a slow disk holds.
    func waitUntilFinished(_ count: UInt64, patience: Duration) async {
        await waitForProgress(deadline: .after(patience)) { $0.finished >= count || $0.stopped }
    }

    /// Suspends until `done` holds of the state, `deadline` passes or the task is cancelled;
    /// woken by ``announceProgress()`` through ``finishedEvents``.
    private func waitForProgress(deadline: Deadline, until done: (State) -> Bool) async {
        while true {
            let seen = finishedEvents.snapshot()
            if state.withLock({ done($0) }) { return }
            do {
                try await finishedEvents.wait(after: seen, deadline: deadline)
            } catch {
                return // the deadline passed, or the task was cancelled: the write is made
            }
        }
    }

    /// Sleeps in the kernel on the progress word until `done` holds of the state, or until
    /// `deadline` (monotonic nanoseconds; `nil`: no deadline).
    private func waitForProgress(deadline: UInt64?, until done: (State) -> Bool) {
        while true {
            let seen = baton_load32(progress)
            if state.withLock({ done($0) }) { return }
            var timeout: Int64 = -1
            if let deadline {
                let now = baton_monotonic_ns()
                guard now < deadline else { return }
                timeout = Int64(clamping: deadline - now)
            }
            _ = AddressWait.wait(on: progress, expecting: seen, timeoutNanoseconds: timeout)
        }
    }

    /// Moves the progress word and wakes its sleepers: a claim finished, or the thread stopped
    /// or ended.
    private func announceProgress() {
        baton_add32(progress, 1)
        AddressWait.wakeAll(progress)
        finishedEvents.notify()
    }

    /// Moves with the progress word, for the tasks that wait
    /// (``waitUntilFinished(_:patience:)-async``).
    private let finishedEvents = EventCounter()

    /// Interrupts the checkpoint that runs now, if one does (a suspension).
    func interrupt() {
        state.withLock { state in
            if state.running, let connection = state.connection { sqlite3_interrupt(connection.handle) }
        }
    }

    /// Closes the connection (a suspension, once no checkpoint runs: it is one of the
    /// database's operations, which the suspension waited for). The next claim opens it again.
    func closeConnection() {
        let connection = state.withLock { state -> Connection? in
            guard !state.running else { return nil }
            defer { state.connection = nil }
            return state.connection
        }
        if let connection { sqlite3_close_v2(connection.handle) }
    }

    /// Ends the thread after the checkpoint it runs, if any, and returns once the thread has
    /// closed its connection; claims not started are dropped (each expires:
    /// ``Checkpointer/plan()``).
    ///
    /// It waits (in the kernel) for the running checkpoint, as a `COMMIT` that checkpoints
    /// waits for the disk, so that a database that is gone leaves no connection behind: one
    /// that closed later kept the database's files open after their owner let go of them (a
    /// released database still had 3 descriptors of its file and 1 of its WAL open, and the
    /// database bench's temporary directories were left half removed). Called on the thread
    /// itself (the database's last reference dropped by one of its hooks), it returns at once:
    /// the thread closes the connection as it ends.
    func stop() {
        let waits = state.withLock { state -> Bool in
            state.stopped = true
            return state.started && !isCurrentThread
        }
        baton_add32(word, 1)
        AddressWait.wakeOne(word)
        announceProgress()
        if waits { waitForProgress(deadline: nil) { $0.exited } }
    }

    /// Whether the calling thread is this object's thread (its context is set in ``run()``).
    private var isCurrentThread: Bool {
        baton_thread_context() == UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque())
    }

    private func run() {
        baton_set_thread_context(UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque()))
        defer {
            end()
            baton_set_thread_context(nil)
        }
        while true {
            let seen = baton_load32(word)
            let next = state.withLock { state -> UInt32?? in
                if state.stopped { return .some(nil) }
                return state.claims.isEmpty ? .none : .some(state.claims.removeFirst())
            }
            switch next {
            case .some(nil):
                return
            case .some(let claimed?):
                checkpoint(claimed: claimed)
                state.withLock { $0.finished += 1 }
                announceProgress()
            case .none:
                _ = AddressWait.wait(on: word, expecting: seen, timeoutNanoseconds: -1)
            }
        }
    }

    /// The thread's last step: closes its connection, then says it has ended (``stop()`` waits
    /// for that).
    private func end() {
        let connection = state.withLock { state -> Connection? in
            defer { state.connection = nil }
            return state.connection
        }
        if let connection { sqlite3_close_v2(connection.handle) }
        state.withLock { $0.exited = true }
        announceProgress()
    }

    private func checkpoint(claimed: UInt32) {
        guard let hooks = state.withLock({ $0.hooks }), hooks.begin() else { return }
        defer { hooks.end() }
        // (A connection only this thread uses, passed through the lock by value.)
        guard let handle = connection(hooks: hooks)?.handle else { return }
        checkpointer.beforeCheckpoint.withLock { $0 }?()
        var log: Int32 = 0, done: Int32 = 0
        let code = sqlite3_wal_checkpoint_v2(handle, nil, SQLITE_CHECKPOINT_PASSIVE, &log, &done)
        let failed = state.withLock { state -> Connection? in
            state.running = false
            if state.checkpoints.count >= Self.resultsKept { state.checkpoints.removeFirst() }
            state.checkpoints.append((code, log, done))
            let primary = code & 0xff
            guard primary != SQLITE_OK && primary != SQLITE_BUSY && primary != SQLITE_INTERRUPT && primary != SQLITE_LOCKED else { return nil }
            defer { state.connection = nil }
            return state.connection
        }
        if let failed {
            makeUnavailable("its checkpoint failed: \(Self.message(failed.handle, code))", hooks: hooks)
            sqlite3_close_v2(failed.handle)
        }
        checkpointer.finishCheckpoint(claimed: claimed)
    }

    /// The thread's connection, marked as running a checkpoint; opened first if it is not open
    /// (outside the lock: opening reads the file). `nil` when it cannot be opened now (a lock
    /// held while another connection recovers the WAL: tried again at the next claim) or at
    /// all (``unavailableReason`` then says why).
    private func connection(hooks: Hooks) -> Connection? {
        let open = state.withLock { state -> Connection?? in
            if state.unavailable != nil { return .some(nil) }
            guard let connection = state.connection else { return .none }
            state.running = true
            return .some(connection)
        }
        if case .some(let connection) = open { return connection }
        var handle: OpaquePointer?
        let code = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, vfs.withLock { $0 })
        // A read of the database's header, so that the connection knows it is in WAL mode and
        // opens the WAL (a checkpoint on a connection that has read nothing yet does nothing
        // and says SQLITE_OK).
        var read = code
        if code == SQLITE_OK, handle != nil { read = sqlite3_exec(handle, "PRAGMA schema_version", nil, nil, nil) }
        if code == SQLITE_OK, read == SQLITE_OK, let handle {
            sqlite3_extended_result_codes(handle, 1)
            let connection = Connection(handle: handle)
            state.withLock { state in
                state.connection = connection
                state.running = true
            }
            return connection
        }
        let primary = read & 0xff
        if code == SQLITE_OK, primary != SQLITE_BUSY, primary != SQLITE_LOCKED {
            makeUnavailable("reading the database on a connection of its own failed: \(Self.message(handle, read))", hooks: hooks)
        } else if code != SQLITE_OK {
            makeUnavailable("opening a connection of its own failed: \(Self.message(handle, code))", hooks: hooks)
        }
        // (SQLite allocates a handle even when opening fails.)
        sqlite3_close_v2(handle)
        return nil
    }

    /// From now on, checkpoints run in the writers' calls; reported once.
    private func makeUnavailable(_ reason: String, hooks: Hooks) {
        state.withLock { $0.unavailable = reason }
        hooks.report(reason)
    }

    private static func message(_ handle: OpaquePointer?, _ code: Int32) -> String {
        let text = handle.flatMap { sqlite3_errmsg($0) }.map { String(cString: $0) } ?? String(cString: sqlite3_errstr(code))
        return "\(text) (SQLite code \(code))"
    }
}
