import Baton
import CBatonShims
import Foundation

/// A minimal cross-process ``ConnectionPermit`` for the command line's workers: an exclusive
/// ``FileLock`` is the permission. A waiter of priority P asks holders of lower priority to stop
/// by posting the Baton signal `lifecycle.NAME.want.P` with its pid as the state, again every
/// 200 ms while it waits, and clears it (state 0) once it holds the lock. A process does not
/// take the lock while a live process of higher priority wants it, so a holder that just
/// yielded cannot grab the lock back.
///
/// A stand-in for roles (issue 3) in the two-process hand-over test until roles are merged;
/// it has no fencing, no critical-section bound and no status. Priorities 1...4.
package struct HandoverPermit: ConnectionPermit {
    package static let priorities: ClosedRange<UInt32> = 1...4

    package let container: SharedContainer
    package let name: String
    package let priority: UInt32

    package init(container: SharedContainer, name: String, priority: UInt32) {
        self.container = container
        self.name = name
        self.priority = min(max(priority, Self.priorities.lowerBound), Self.priorities.upperBound)
    }

    package func signalName(_ priority: UInt32) -> String { "lifecycle.\(name).want.\(priority)" }

    private var higherPriorities: [UInt32] {
        priority < Self.priorities.upperBound ? Array((priority + 1)...Self.priorities.upperBound) : []
    }

    package func acquire(deadline: Deadline) async throws -> any ConnectionGrant {
        let lock = try FileLock(container, name: "lifecycle/\(name).lock")
        let signals = try container.signals
        let pid = UInt64(UInt32(bitPattern: getpid()))
        // Observe before taking the lock, so that a request made while we wait is not lost.
        let requests = try higherPriorities.map { try signals.observe(signalName($0)) }
        while true {
            if try higherPriorityWaiterIsAlive(signals) {
                if deadline.hasPassed { throw BatonError(.timedOut, "a process of higher priority wants the permit \(name)") }
                try await Task.sleep(for: .milliseconds(20))
                continue
            }
            try signals.post(signalName(priority), state: pid)
            do {
                let held = try await lock.lock(.exclusive, deadline: Deadline.after(.milliseconds(200)).earliest(deadline))
                try signals.post(signalName(priority), state: 0)
                return Grant(held: held, requests: requests)
            } catch let error as BatonError where error.code == .timedOut && !deadline.hasPassed {
                continue
            }
        }
    }

    private func higherPriorityWaiterIsAlive(_ signals: Signals) throws -> Bool {
        for higher in higherPriorities {
            let waiter = try signals.state(of: signalName(higher))
            if waiter != 0, kill(pid_t(truncatingIfNeeded: waiter), 0) == 0 { return true }
        }
        return false
    }

    struct Grant: ConnectionGrant {
        let held: HeldFileLock
        let requests: [SignalObservation]

        func stopRequested() async throws {
            let pid = UInt64(UInt32(bitPattern: getpid()))
            try await withThrowingTaskGroup(of: Void.self) { group in
                for observation in requests {
                    group.addTask {
                        while true {
                            let request = try await observation.next(deadline: .never)
                            if request.state != 0 && request.state != pid { return }
                        }
                    }
                }
                defer { group.cancelAll() }
                if requests.isEmpty {
                    try await Task.sleep(for: .seconds(365 * 86_400)) // the highest priority is never asked
                }
                try await group.next()
            }
        }

        func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R {
            try await body()
        }

        func release() async {
            for observation in requests { observation.cancel() }
            held.release()
        }
    }
}
