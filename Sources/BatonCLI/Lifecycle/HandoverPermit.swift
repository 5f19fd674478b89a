import Baton
import CBatonShims
import Foundation

/// A minimal cross-process ``ConnectionPermit`` for the command line's workers: an exclusive
/// ``FileLock`` is the permission, and a waiter of higher priority asks the holder to stop by
/// posting the Baton signal `lifecycle.NAME.want` (state = priority << 32 | pid), again every
/// 200 ms while it waits (signals coalesce, so one request may hide another).
///
/// A stand-in for roles (issue 3) in the two-process hand-over test until roles are merged;
/// `RolePermit` replaces it then. It has no fencing, no critical-section bound and no status.
struct HandoverPermit: ConnectionPermit {
    let container: SharedContainer
    let name: String
    let priority: UInt32

    var signalName: String { "lifecycle.\(name).want" }

    func acquire(deadline: Deadline) async throws -> any ConnectionGrant {
        let lock = try FileLock(container, name: "lifecycle/\(name).lock")
        let signals = try container.signals
        let me = UInt64(priority) << 32 | UInt64(UInt32(bitPattern: getpid()))
        // Observe before taking the lock, so that a request made while we wait is not lost.
        let requests = try signals.observe(signalName)
        while true {
            try signals.post(signalName, state: me)
            do {
                let held = try await lock.lock(.exclusive, deadline: Deadline.after(.milliseconds(200)).earliest(deadline))
                return Grant(held: held, requests: requests, priority: priority)
            } catch let error as BatonError where error.code == .timedOut && !deadline.hasPassed {
                continue
            }
        }
    }

    struct Grant: ConnectionGrant {
        let held: HeldFileLock
        let requests: SignalObservation
        let priority: UInt32

        func stopRequested() async throws {
            let pid = UInt32(bitPattern: getpid())
            while true {
                let request = try await requests.next(deadline: .never)
                let (asker, askerPID) = (UInt32(request.state >> 32), UInt32(truncatingIfNeeded: request.state))
                if askerPID != pid && asker > priority { return }
            }
        }

        func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R {
            try await body()
        }

        func release() async {
            requests.cancel()
            held.release()
        }
    }
}
