@testable import Baton
import BatonTestSupport
import Foundation
import Testing

/// `SharedChannel.executor`: waits made on its thread sleep there, on the channel's own word.
@Suite("Channel executor")
struct ChannelExecutorTests {
    @Test("a receive on the channel executor sleeps on the executor's thread and is woken by another process's send")
    func receiveWokenByAnotherProcess() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let channel = try SharedChannel<Int>(container, name: "executor-receive", capacity: .unbounded)
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
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let channel = try SharedChannel<Int>(container, name: "executor-idle", capacity: .unbounded)
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
        waiting.cancel()
        await #expect(throws: CancellationError.self) { try await waiting.value }
        // Nothing is left counted as asleep on the word: a send makes no wake-up call for it.
        try await channel.send(5)
        #expect(try await channel.receive(deadline: .after(.seconds(5))) == 5)
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
}
