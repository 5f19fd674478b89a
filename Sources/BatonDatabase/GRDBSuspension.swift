import Foundation
import GRDB
import Synchronization

/// GRDB's own suspension (`Database.suspendNotification` / `resumeNotification`), which the
/// shared database uses to suspend its pool without closing it: GRDB interrupts the writer
/// connection's running statement and, until resumed, refuses every statement that could take a
/// write lock (rolling back the transaction it finds open and throwing `SQLITE_ABORT`, "Database
/// is suspended"), while reads in WAL mode go on.
///
/// GRDB's suspension is process-wide: the notifications reach every GRDB database of the process
/// opened with `observesSuspensionNotifications`. So this counts the shared databases of the
/// process that are suspended: the first one posts the suspension, the last one to resume posts
/// the resumption (a process's databases are suspended together by their container).
enum GRDBSuspension {
    private static let suspended = Mutex(0)

    /// Suspends every GRDB database of the process that observes the notifications, if it was not.
    static func suspend() {
        let first = suspended.withLock { count -> Bool in
            count += 1
            return count == 1
        }
        // (Observers run on this thread: the writer is interrupted when this returns.)
        if first { NotificationCenter.default.post(name: Database.suspendNotification, object: nil) }
    }

    /// Ends one ``suspend()``; the last one resumes the databases.
    static func resume() {
        let last = suspended.withLock { count -> Bool in
            guard count > 0 else { return false }
            count -= 1
            return count == 0
        }
        if last { NotificationCenter.default.post(name: Database.resumeNotification, object: nil) }
    }
}
