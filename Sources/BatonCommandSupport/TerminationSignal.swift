import Dispatch
import Synchronization
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// Waits for SIGTERM or SIGINT without blocking a thread.
///
/// Call ``prepare()`` first thing in a command that waits for it: a signal that arrives before
/// the handlers are in place would kill the process (a test may send SIGTERM as soon as the
/// command says it is ready, while its main task has not reached ``wait()`` yet).
package enum TerminationSignal {
    private static let state = Mutex<(fired: Bool, next: Int, waiters: [Int: CheckedContinuation<Void, Never>])>((false, 0, [:]))
    private nonisolated(unsafe) static var sources: [any DispatchSourceSignal] = []
    private static let installed: Void = {
        let queue = DispatchQueue(label: "baton.termination")
        for number in [SIGTERM, SIGINT] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler { TerminationSignal.fire() }
            source.resume()
            sources.append(source)
        }
    }()

    /// Catches SIGTERM and SIGINT from now on (idempotent).
    package static func prepare() { _ = installed }

    /// Returns once SIGTERM or SIGINT has arrived (since ``prepare()``), or when the task is
    /// cancelled.
    package static func wait() async {
        prepare()
        let id = state.withLock { state -> Int in
            state.next += 1
            return state.next
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.fired || Task.isCancelled { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }

    private static func fire() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.fired = true
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }
}
