@testable import Baton
import BatonTestSupport
import Foundation
import Synchronization
import Testing

/// `SharedChannel.executor`: waits made on its thread sleep there, on the channel's own word.
@Suite("Channel executor")
struct ChannelExecutorTests {
    @Test("a receive on the channel executor sleeps on the executor's thread and is woken by another process's send")
    func receiveWokenByAnotherProcess() async throws {
        let (directory, channel) = try Self.newChannel("executor-receive")
        let before = ChannelExecutor.shared.waitsRegistered
        let sender = Task {
            // Sends once the receive waits on the executor (a fixed 300 ms sleep could end
            // before it, on a loaded runner: the receive then found the element, with no wait).
            let start = ContinuousClock.now
            while ChannelExecutor.shared.waitsRegistered == before, ContinuousClock.now - start < .seconds(30) {
                try await Task.sleep(for: .milliseconds(5))
            }
            return try await runBaton(["channel", "send", "executor-receive", "41"], container: directory.path).status
        }
        let received = try await withTaskExecutorPreference(channel.executor) {
            try await channel.receive(deadline: .after(.seconds(30)))
        }
        #expect(received == 41)
        #expect(try await sender.value == 0)
        // The wait was the executor's own (not a doorbell thread's, resumed through the queue).
        #expect(ChannelExecutor.shared.waitsRegistered > before)
    }

    @Test("a wait on the channel executor ends at its deadline with timedOut, and on cancellation with CancellationError")
    func deadlineAndCancellation() async throws {
        let (directory, channel) = try Self.newChannel("executor-idle")
        defer { withExtendedLifetime(directory) {} }
        let start = ContinuousClock.now
        await #expect(throws: BatonError.self) {
            try await withTaskExecutorPreference(channel.executor) {
                _ = try await channel.receive(deadline: .after(.milliseconds(200)))
            }
        }
        #expect(ContinuousClock.now - start >= .milliseconds(200))

        let waiting = Task {
            try await withTaskExecutorPreference(channel.executor) {
                _ = try await channel.receive(deadline: .after(.seconds(60)))
            }
        }
        try await Task.sleep(for: .milliseconds(200))
        let cancelled = ContinuousClock.now
        waiting.cancel()
        await #expect(throws: CancellationError.self) { try await waiting.value }
        // At the cancellation, not at the deadline a minute later (half a minute is room for
        // a starved run's scheduling).
        #expect(ContinuousClock.now - cancelled < .seconds(30))
        // Nothing is left counted as asleep on the word: a send makes no wake-up call for it.
        try await channel.send(5)
        #expect(try await channel.receive(deadline: .after(.seconds(5))) == 5)
    }

    @Test("a task queued on the executor while another task's wait sleeps on its thread runs at once, and the wait goes on")
    func jobQueuedDuringAnInlineSleep() async throws {
        // Unbounded: its receive sleeps until the deadline (a rendezvous wait goes round every
        // 250 ms, which would free the thread anyway).
        let (directory, channel) = try Self.newChannel("executor-inline")
        let before = ChannelExecutor.shared.waitsRegistered
        let waiting = Task {
            try await withTaskExecutorPreference(channel.executor) {
                try await channel.receive(deadline: .after(.seconds(60)))
            }
        }
        // The receive sleeps on the executor's thread (nothing else to run there).
        let start = ContinuousClock.now
        while ChannelExecutor.shared.waitsRegistered == before || channel.log.readable.sleeperCount == 0 {
            try await Task.sleep(for: .milliseconds(5))
            try #require(ContinuousClock.now - start < .seconds(20), "the receive never slept on the executor")
        }
        // Work queued on the executor from another thread must not wait for that receive.
        let queued = ContinuousClock.now
        let ran = try await withTaskExecutorPreference(channel.executor) { () async throws -> Bool in
            ChannelExecutor.shared.isCurrentForTesting
        }
        #expect(ran)
        #expect(ContinuousClock.now - queued < .seconds(30))
        // The receive still waits, and gets the element another process sends.
        let sent = try await runBaton(["channel", "send", "executor-inline", "7"], container: directory.path, timeout: 20)
        #expect(sent.status == 0)
        #expect(try await waiting.value == 7)
    }

    @Test("two tasks on the executor wait at once (one on the thread, one through the doorbell): both get their element")
    func twoWaitsAtOnce() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let first = try SharedChannel<Int>(container, name: "executor-first", capacity: .rendezvous)
        let second = try SharedChannel<Int>(container, name: "executor-second", capacity: .rendezvous)
        async let a = withTaskExecutorPreference(first.executor) { try await first.receive(deadline: .after(.seconds(30))) }
        async let b = withTaskExecutorPreference(second.executor) { try await second.receive(deadline: .after(.seconds(30))) }
        try await Task.sleep(for: .milliseconds(200))
        let sent = try await runBaton(["channel", "send", "executor-second", "2"], container: directory.path)
        let sentFirst = try await runBaton(["channel", "send", "executor-first", "1"], container: directory.path)
        #expect(sent.status == 0 && sentFirst.status == 0)
        #expect(try await a == 1)
        #expect(try await b == 2)
    }

    /// A channel `name` of `capacity` (unbounded unless given) in a new container (keep the
    /// container alive while the channel is used).
    private static func newChannel(_ name: String, capacity: ChannelCapacity = .unbounded) throws -> (TemporaryContainer, SharedChannel<Int>) {
        let directory = try TemporaryContainer()
        return (directory, try SharedChannel<Int>(try SharedContainer(path: directory.path), name: name, capacity: capacity))
    }

    /// ``newChannel(_:capacity:)`` whose rings made on the channel executor always wait
    /// for the task's next wait or suspension, whatever the processor hints say.
    private static func alwaysDeferringChannel(_ name: String, capacity: ChannelCapacity = .unbounded) throws -> (TemporaryContainer, SharedChannel<Int>) {
        let (directory, channel) = try newChannel(name, capacity: capacity)
        channel.log.defersRingsAlways.store(true, ordering: .relaxed)
        return (directory, channel)
    }

    @Test("a ring made by a task on the channel executor waits for the task's next suspension, then goes")
    func ringWaitsForTheTasksSuspension() async throws {
        let (directory, channel) = try Self.alwaysDeferringChannel("executor-deferred")
        defer { withExtendedLifetime(directory) {} }
        let (before, afterSend, afterSuspension) = try await withTaskExecutorPreference(channel.executor) {
            let before = channel.log.readable.snapshot()
            try await channel.send(1)
            let afterSend = channel.log.readable.snapshot()
            // The task suspends (its job ends) and runs again on the executor's thread.
            await Task.yield()
            return (before, afterSend, channel.log.readable.snapshot())
        }
        #expect(afterSend == before)
        #expect(afterSuspension == before + 1)
        #expect(try await channel.receive(deadline: .after(.seconds(5))) == 1)
    }

    @Test("a deferred ring wakes another process's receiver when the sending task then sleeps for something else")
    func deferredRingReachesASleepingReceiver() async throws {
        let (directory, channel) = try Self.alwaysDeferringChannel("executor-deferred-peer")
        let receiver = Task { try await runBaton(["channel", "receive", "executor-deferred-peer", "--count", "1"], container: directory.path, timeout: 20) }
        // The receiver counts itself asleep on the word before the send (its ring must wake it).
        let start = ContinuousClock.now
        while channel.log.readable.sleeperCount == 0 {
            try await Task.sleep(for: .milliseconds(5))
            try #require(ContinuousClock.now - start < .seconds(20), "the receiver never went to sleep on the channel")
        }
        let sender = Task {
            try await withTaskExecutorPreference(channel.executor) {
                try await channel.send(42)
                // Suspends for a minute (not a channel wait): the ring goes when the job ends.
                try await Task.sleep(for: .seconds(60))
            }
        }
        defer { sender.cancel() }
        let sent = ContinuousClock.now
        let result = try await receiver.value
        #expect(result.status == 0)
        #expect(result.lines.contains { $0.contains("42") })
        #expect(ContinuousClock.now - sent < .seconds(30))
    }

    /// How a waiting rendezvous send is made in ``ownRingsDoNotEndTheWait(_:)``.
    enum WaitingSend: CaseIterable, CustomTestStringConvertible {
        case send, select
        var testDescription: String {
            switch self {
            case .send: "send"
            case .select: "a select of one rendezvous send"
            }
        }
    }

    /// The rings a pass of a waiting rendezvous send defers on the channel executor (its
    /// offer's, and its withdrawal of the last pass's offer) are made before it reads the
    /// doorbell it waits on. They were made after that read, by the spin: the writable doorbell
    /// had then moved past it, so the wait ended at once on the task's own ring, and the send
    /// withdrew and offered again, a system call a turn. On one processor (as on a loaded
    /// machine) that went on until the scheduler's tick gave the receiver the processor: up to
    /// 1,300 wake-ups and 10 ms per send in `bench channels`. Here with no receiver, each pass
    /// is one slice (250 ms for a file's channel): a handful of rings in 1.2 s, not thousands.
    @Test("a waiting rendezvous send is not woken by its own deferred rings: one pass per slice, not a spin", arguments: WaitingSend.allCases)
    func ownRingsDoNotEndTheWait(_ way: WaitingSend) async throws {
        let (directory, channel) = try Self.alwaysDeferringChannel("executor-own-rings", capacity: .rendezvous)
        defer { withExtendedLifetime(directory) {} }
        let writable = channel.log.writable.snapshot()
        let readable = channel.log.readable.snapshot()
        let outcome = try await withTaskExecutorPreference(channel.executor) { () async throws -> BatonError.Code? in
            do {
                let deadline = Deadline.after(.milliseconds(1_200))
                switch way {
                case .send:
                    try await channel.send(1, deadline: deadline)
                case .select:
                    try await select(.send(1, to: channel) {}, deadline: deadline)
                }
                return nil
            } catch let error as BatonError {
                return error.code
            }
        }
        #expect(outcome == .timedOut)
        // Each pass rings once for its offer and once for its withdrawal.
        let rings = (writable: channel.log.writable.snapshot() &- writable, readable: channel.log.readable.snapshot() &- readable)
        #expect(rings.writable <= 12 && rings.readable <= 12, "\(rings) rings in 1.2 s")
        #expect(try channel.tryReceive() == nil) // nothing left offered
    }

    @Test("a doorbell says whether a ring would wake a waiter that went to sleep on this processor")
    func sleeperProcessorHint() throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let channel = try SharedChannel<Int>(container, name: "executor-hint", capacity: .unbounded)
        let doorbell = channel.log.readable
        #expect(!doorbell.wouldWakeSleeperHere) // nobody asleep
        // The thread may move to another processor between the wait and the look: try again
        // until both happened on one.
        var looked = false
        for _ in 0..<1_000 where !looked {
            let processor = CurrentProcessor.hint
            #expect(doorbell.beginWait(after: doorbell.snapshot()))
            let answer = doorbell.wouldWakeSleeperHere
            let still = CurrentProcessor.hint == processor
            doorbell.endWaits(1)
            if still, processor != 0 {
                #expect(answer)
                looked = true
            }
        }
        #expect(looked)
        #expect(!doorbell.wouldWakeSleeperHere) // the wait ended
    }
}
