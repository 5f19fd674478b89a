#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Baton
import CBatonShims
import GRDB
import Synchronization

/// SQLite's busy handler for the shared database (GRDB `busyMode = .callback`).
///
/// Baton's own writes (``SharedDatabase/write(_:)``) are ordered by the writer queue before they
/// ask SQLite, so they meet a busy lock only when a connection that does not use Baton holds it.
/// A write made through the plain pool (``SharedDatabase/pool``, handed to third-party code)
/// skips the queue: when it finds SQLite's write lock taken while a Baton writer of any process
/// has the queue, it waits in the queue itself (blocking in the kernel, woken when the holder
/// hands the turn on or dies), lets the turn go at once, and retries: it is woken when the lock
/// frees instead of sleeping up to 100 ms a step as SQLite's default handler does.
///
/// A lock held by a program that does not use Baton (the `sqlite3` shell) gives no event to wait
/// for (SQLite's locks are POSIX byte-range locks that no waiter is told about): then it sleeps
/// between tries, like `sqlite3_busy_timeout`. It gives up at once when the database is being
/// suspended or SQLite's locks are only tried (the same-thread fast path's `BEGIN`, a
/// checkpoint's opportunistic restart), and soon when a writer bounds the WAL.
final class BusyWait: Sendable {
    let timeout: Duration
    let interruption: InterruptionFlag
    let tryOnce: InterruptionFlag
    let checkpointing: InterruptionFlag
    /// Set while a Baton write of this process holds its turn in the queue (it must not queue
    /// behind itself).
    let holdingTurn: InterruptionFlag
    let queue: TicketLock
    /// When the current wait began (monotonic ns), set on its first call.
    private let started = Atomic<UInt64>(0)

    init(timeout: Duration, interruption: InterruptionFlag, tryOnce: InterruptionFlag, checkpointing: InterruptionFlag, holdingTurn: InterruptionFlag, queue: TicketLock) {
        self.timeout = timeout
        self.interruption = interruption
        self.tryOnce = tryOnce
        self.checkpointing = checkpointing
        self.holdingTurn = holdingTurn
        self.queue = queue
    }

    /// How long a size-bounding checkpoint waits for readers (it holds up the other writers).
    static let checkpointTimeout: Duration = .milliseconds(50)

    /// Sleeps between tries while a connection that does not use Baton holds the lock, as
    /// SQLite's own handler does.
    static let delays: [Duration] = [
        .microseconds(100), .microseconds(200), .microseconds(500), .milliseconds(1), .milliseconds(2),
        .milliseconds(5), .milliseconds(10), .milliseconds(20), .milliseconds(50),
    ]

    /// Called by SQLite with the number of earlier tries of this wait: whether to try again.
    func shouldRetry(_ tries: Int) -> Bool {
        if interruption.isSet || tryOnce.isSet { return false }
        let now = baton_monotonic_ns()
        if tries == 0 { started.store(now, ordering: .relaxed) }
        let limit = checkpointing.isSet ? min(timeout, Self.checkpointTimeout) : timeout
        let waited = Duration.nanoseconds(Int64(clamping: now &- started.load(ordering: .relaxed)))
        guard waited < limit else { return false }
        if !holdingTurn.isSet, !checkpointing.isSet, queue.holder != nil {
            // A Baton writer has the queue: wait for the turn, then let it go and retry.
            let ticket = try? queue.acquire(deadline: .after(limit - waited)) {
                self.interruption.isSet ? CancellationError() : nil
            }
            guard let ticket else { return false }
            queue.release(ticket)
            return !interruption.isSet
        }
        let delay = min(Self.delays[min(tries, Self.delays.count - 1)], limit - waited)
        usleep(UInt32(clamping: Int64(delay.timeInterval * 1_000_000)))
        return !interruption.isSet
    }
}
