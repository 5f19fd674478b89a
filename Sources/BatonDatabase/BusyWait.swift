#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import CBatonShims
import GRDB

/// SQLite's busy handler for the shared database: waits for a lock held by a connection that does
/// not use Baton (Baton's own writers are ordered by the writer queue before they ask SQLite),
/// like `sqlite3_busy_timeout`, but gives up at once when the database is being suspended or
/// SQLite's locks are only tried (the same-thread fast path's `BEGIN`, a checkpoint's
/// opportunistic restart), and soon when a writer bounds the WAL.
struct BusyWait: Sendable {
    let timeout: Duration
    let interruption: InterruptionFlag
    let tryOnce: InterruptionFlag
    let checkpointing: InterruptionFlag

    /// How long a size-bounding checkpoint waits for readers (it holds up the other writers).
    static let checkpointTimeout: Duration = .milliseconds(50)

    /// Sleeps between tries, as SQLite's own handler does (there is no event to wait for: SQLite
    /// locks are POSIX byte-range locks that no waiter is told about).
    static let delays: [Duration] = [
        .microseconds(100), .microseconds(200), .microseconds(500), .milliseconds(1), .milliseconds(2),
        .milliseconds(5), .milliseconds(10), .milliseconds(20), .milliseconds(50),
    ]

    /// Called by SQLite with the number of earlier tries of this wait: whether to try again.
    func shouldRetry(_ tries: Int) -> Bool {
        if interruption.isSet || tryOnce.isSet { return false }
        var waited = Duration.zero
        for index in 0..<tries { waited += Self.delays[min(index, Self.delays.count - 1)] }
        let limit = checkpointing.isSet ? min(timeout, Self.checkpointTimeout) : timeout
        guard waited < limit else { return false }
        let delay = min(Self.delays[min(tries, Self.delays.count - 1)], limit - waited)
        usleep(UInt32(clamping: Int64(delay.timeInterval * 1_000_000)))
        return !interruption.isSet
    }
}
