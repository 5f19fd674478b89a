import Baton
import BatonTestSupport
import Testing

@Suite("EventCounter waits on several sources")
struct EventCounterTests {
    @Test("waitAny returns the source that moved, even when it moved before the wait began")
    func returnsTheSourceThatMoved() async throws {
        let a = EventCounter(), b = EventCounter()
        let seenA = a.snapshot(), seenB = b.snapshot()
        b.notify()
        #expect(try await EventCounter.waitAny([(a, seenA), (b, seenB)], deadline: .after(.seconds(10))) == 1)
        let waiting = Task { try await EventCounter.waitAny([(a, a.snapshot()), (b, b.snapshot())], deadline: .after(.seconds(30))) }
        try await Task.sleep(for: .milliseconds(20))
        a.notify()
        #expect(try await waiting.value == 0)
    }

    @Test("waitAny throws timedOut at its deadline and CancellationError when cancelled")
    func deadlineAndCancellation() async throws {
        let a = EventCounter(), b = EventCounter()
        let error = try await #require(throws: BatonError.self) {
            try await EventCounter.waitAny([(a, a.snapshot()), (b, b.snapshot())], deadline: .after(.milliseconds(30)))
        }
        #expect(error.code == .timedOut)
        let waiting = Task { try await EventCounter.waitAny([(a, a.snapshot()), (b, b.snapshot())], deadline: .never) }
        try await Task.sleep(for: .milliseconds(20))
        waiting.cancel()
        await #expect(throws: CancellationError.self) { _ = try await waiting.value }
        // The cancelled wait left nothing registered: a later wait still works.
        let seen = a.snapshot()
        a.notify()
        #expect(try await EventCounter.waitAny([(a, seen)], deadline: .after(.seconds(10))) == 0)
    }
}
