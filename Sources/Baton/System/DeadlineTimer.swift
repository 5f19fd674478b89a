import CBatonShims
import Synchronization

/// Fires callbacks at deadlines from one kernel-wait thread per process, so that a wait with a
/// deadline costs a heap insertion instead of a sleeping child task.
final class DeadlineTimer: @unchecked Sendable {
    // @unchecked: `entries` live in `state` (a Mutex); `word` is only touched through atomics
    // and ``AddressWait``.
    static let shared = DeadlineTimer()

    private struct Entry {
        var when: ContinuousClock.Instant
        var id: UInt64
        var fire: @Sendable () -> Void
    }

    private struct State {
        var entries: [UInt64: Entry] = [:]
        var nextID: UInt64 = 0
        var started = false
        /// When the thread will wake by itself (`nil`: never). A new deadline wakes it only when
        /// earlier, so re-arming a later deadline in a loop costs no system call.
        var armedUntil: ContinuousClock.Instant?
    }

    private let state = Mutex(State())
    /// The timer thread sleeps on this word; schedule() bumps it when an earlier deadline arrives.
    private let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)

    private init() { word.initialize(to: 0) }

    /// Calls `fire` (on the timer thread) at `when` unless cancelled first. Returns a token.
    func schedule(at when: ContinuousClock.Instant, _ fire: @escaping @Sendable () -> Void) -> UInt64 {
        let (id, start, earliest) = state.withLock { state -> (UInt64, Bool, Bool) in
            state.nextID &+= 1
            state.entries[state.nextID] = Entry(when: when, id: state.nextID, fire: fire)
            let start = !state.started
            state.started = true
            let earliest = state.armedUntil.map { when < $0 } ?? true
            if earliest { state.armedUntil = when }
            return (state.nextID, start, earliest)
        }
        if start {
            KernelThread.spawn(name: "baton-timer") { [self] in self.run() }
        } else if earliest {
            baton_add32(word, 1)
            AddressWait.wakeOne(word)
        }
        return id
    }

    /// Cancels a scheduled callback; harmless if it already fired.
    func cancel(_ id: UInt64) {
        state.withLock { _ = $0.entries.removeValue(forKey: id) }
    }

    private func run() {
        while true {
            let seen = baton_load32(word)
            let now = ContinuousClock.now
            let (due, next) = state.withLock { state -> ([Entry], ContinuousClock.Instant?) in
                var due: [Entry] = []
                var next: ContinuousClock.Instant?
                for (id, entry) in state.entries {
                    if entry.when <= now {
                        due.append(entry)
                        state.entries[id] = nil
                    } else if next.map({ entry.when < $0 }) ?? true {
                        next = entry.when
                    }
                }
                state.armedUntil = due.isEmpty ? next : now
                return (due, next)
            }
            for entry in due { entry.fire() }
            if !due.isEmpty { continue }
            _ = AddressWait.wait(on: word, expecting: seen, timeoutNanoseconds: AddressWait.timeout(until: next))
        }
    }
}
