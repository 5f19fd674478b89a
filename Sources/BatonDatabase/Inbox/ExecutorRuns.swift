import Baton
import Synchronization

/// The executor runs of this process, one per inbox (container, role, signal): the state that
/// lets several callers of ``Inbox/message(id:deadline:source:)`` in one process (iOS runs
/// several extension instances as threads of one process) share one run of the source.
///
/// A caller that finds no run takes the run over (``begin(_:)``); the others add the ids they
/// want (``want(_:in:)``) so the run keeps going until those are stored too, and wait.
final class ExecutorRuns: Sendable {
    /// The process-wide registry: every `Inbox` value of a process shares it.
    static let shared = ExecutorRuns()

    private struct Entry {
        var running = false
        var wanted: [String: Int] = [:]
        var received: Set<String> = []
    }

    private let entries = Mutex<[String: Entry]>([:])
    /// Bumped on every change to any entry, and by running sources on each delivery.
    let changes = EventCounter()

    /// Registers interest in `id`; undo with ``unwant(_:in:)``.
    func want(_ id: String, in key: String) {
        entries.withLock { $0[key, default: Entry()].wanted[id, default: 0] += 1 }
        changes.notify()
    }

    func unwant(_ id: String, in key: String) {
        entries.withLock { entries in
            guard var entry = entries[key], let count = entry.wanted[id] else { return }
            if count <= 1 {
                entry.wanted[id] = nil
                entry.received.remove(id)
            } else {
                entry.wanted[id] = count - 1
            }
            entries[key] = entry.wanted.isEmpty && !entry.running ? nil : entry
        }
        changes.notify()
    }

    /// The ids the callers of this process wait for.
    func wanted(in key: String) -> Set<String> {
        entries.withLock { $0[key].map { Set($0.wanted.keys) } ?? [] }
    }

    /// Takes over the run of `key` if nobody in this process has it; returns whether it did.
    func begin(_ key: String) -> Bool {
        let began = entries.withLock { entries -> Bool in
            if entries[key]?.running == true { return false }
            entries[key, default: Entry()].running = true
            return true
        }
        if began { changes.notify() }
        return began
    }

    /// Ends the run of `key` taken with ``begin(_:)``.
    func end(_ key: String) {
        entries.withLock { entries in
            guard var entry = entries[key] else { return }
            entry.running = false
            entries[key] = entry.wanted.isEmpty ? nil : entry
        }
        changes.notify()
    }

    /// Whether a caller of this process holds the run of `key`.
    func isRunning(_ key: String) -> Bool {
        entries.withLock { $0[key]?.running ?? false }
    }

    /// Notes that this process's source delivered `id` (for ``InboxRoute``), and wakes waiters.
    func noteReceived(_ id: String, in key: String) {
        entries.withLock { entries in
            if entries[key]?.wanted[id] != nil { entries[key]?.received.insert(id) }
        }
        changes.notify()
    }

    /// Whether this process's source delivered `id` while someone here wanted it.
    func wasReceived(_ id: String, in key: String) -> Bool {
        entries.withLock { $0[key]?.received.contains(id) ?? false }
    }
}
