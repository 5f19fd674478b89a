import Baton
import BatonDatabase
import Foundation
import BatonTestSupport
import Testing

/// The writer queue (`TicketLock`) with real processes: owners that die, owners that keep the
/// turn idle.
@Suite("Writer queue")
struct WriterQueueTests {
    @Test("a waiter killed while the holder keeps its turn idle does not stall the waiters behind it")
    func deadWaiterBehindAnIdleKeptTurn() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let queue = try TicketLock(container, name: "queue")
        // This process holds the turn, working (a kept turn is taken over only when idle).
        let ticket = try queue.acquire(deadline: .after(.seconds(5)), interruption: { nil })
        // A waiter queues behind it, then dies while queued.
        let dead = try ChildProcess(harness: ["kernel-test", "queue-acquire", "--name", "queue", "--timeout", "30"], container: directory.path)
        try await dead.line(timeout: 30) { $0 == "started" }
        try await Task.sleep(for: .milliseconds(300))
        dead.signal(SIGKILL)
        _ = try await dead.wait()
        // The holder goes idle, keeping its turn (as the shared database does after a commit).
        queue.keep(ticket)
        // The next waiter must take the idle kept turn over (after TicketLock.idleLimit), not
        // wait for the holder's next write behind the dead waiter's ticket.
        let next = try ChildProcess(harness: ["kernel-test", "queue-acquire", "--name", "queue", "--timeout", "5"], container: directory.path)
        let outcome = try await next.line(timeout: 30) { $0 == "acquired" || $0 == "busy" }
        #expect(outcome == "acquired")
        #expect(!queue.resume(ticket), "the kept turn was taken over")
        next.signal(SIGKILL)
    }

    @Test("a holder killed in its turn hands the queue on at once, with no liveness timer")
    func killedHolderHandsOn() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let queue = try TicketLock(container, name: "queue")
        let holder = try ChildProcess(harness: ["kernel-test", "queue-acquire", "--name", "queue"], container: directory.path)
        try await holder.line(timeout: 30) { $0 == "acquired" }
        // The wait runs on a thread of its own: blocking a pool thread for it could leave this
        // task no thread to send the SIGKILL on (the wait then ran out after 20 s, `busy`).
        // The time is taken on that thread too, as the wait ends: not when this task resumes.
        let waiting = Task {
            try await onOwnThread { (ticket: try queue.acquire(deadline: .after(.seconds(60)), interruption: { nil }), at: ContinuousClock.now) }
        }
        try await Task.sleep(for: .milliseconds(200))
        let killed = ContinuousClock.now
        holder.signal(SIGKILL)
        let acquired = try await waiting.value
        // At once: no 100 ms liveness interval (TicketLock.livenessInterval) per check, and
        // far from the 60 s deadline; 30 s leaves room for a starved run's scheduling (a
        // CI run's threads waited seconds for a processor).
        #expect(acquired.at - killed < .seconds(30))
        queue.release(acquired.ticket)
    }

    /// A run of tickets that nobody took, left by another program changing the dispenser
    /// (`next`) or the `serving` word, is passed in one step after one liveness interval, not one
    /// interval per ticket (20,000 of them took 2,000 s: every writer got `busy`).
    @Test("a forged dispenser or serving word does not make every writer busy", arguments: [(64, 20_000), (128, -1_000)])
    func forgedQueueWord(_ forged: (offset: Int, delta: Int)) async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let queue = try TicketLock(container, name: "queue")
        for _ in 0..<3 { queue.release(try queue.acquire(deadline: .after(.seconds(5)), interruption: { nil })) }
        let file = directory.path + "/.baton/queue"
        let fd = open(file, O_RDWR | O_CLOEXEC)
        var word: UInt32 = 0
        #expect(pread(fd, &word, 4, off_t(forged.offset)) == 4)
        word = UInt32(truncatingIfNeeded: Int(word) + forged.delta)
        #expect(pwrite(fd, &word, 4, off_t(forged.offset)) == 4)
        close(fd)
        // In another process too: its ticket is one of the run's.
        let other = try ChildProcess(harness: ["kernel-test", "queue-acquire", "--name", "queue", "--timeout", "5"], container: directory.path)
        #expect(try await other.line(timeout: 30) { $0 == "acquired" || $0 == "busy" } == "acquired")
        other.signal(SIGKILL)
        _ = try await other.wait()
        let ticket = try queue.acquire(deadline: .after(.seconds(5)), interruption: { nil })
        queue.release(ticket)
    }
}
