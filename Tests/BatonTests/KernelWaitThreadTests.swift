@testable import Baton
import BatonTestSupport
import Foundation
import CBatonShims
import Synchronization
import Testing

/// The one kernel-wait thread (`KernelWaitThread`) behind channel doorbells, the signal thread
/// and the deadline timer: its rules on their own (`KernelWaitState`, no threads), then one
/// thread with many waits at once, each ending at its own deadline, on its own ring, or by its
/// own cancellation.
@Suite("Kernel-wait thread")
struct KernelWaitThreadTests {
    typealias Machine = KernelWaitState<String, String>

    /// A time of the state machine: `milliseconds` in nanoseconds.
    private static func at(_ milliseconds: Int64) -> Int64 { milliseconds * 1_000_000 }

    // MARK: The rules (pure)

    @Test("each wait ends on its own: ready when the generation moved past what it saw, expired at its own deadline, the rest stay")
    func roundEndsOnlyWhatIsDue() {
        var machine = Machine(watching: .always)
        _ = machine.add(id: 1, seen: 5, deadline: nil, resumption: "rung")
        _ = machine.add(id: 2, seen: 6, deadline: Self.at(100), resumption: "current")
        _ = machine.add(id: 3, seen: nil, deadline: Self.at(50), resumption: "due")
        _ = machine.add(id: 4, seen: nil, deadline: Self.at(300), resumption: "later")
        let round = machine.round(watch: ("word", 6), clock: { Self.at(60) })
        #expect(round.ready == ["rung"])
        #expect(round.expired == ["due"])
        #expect(round.endedWatches == 1)
        #expect(Set(machine.waiters.keys) == [2, 4])
        #expect(machine.watchers == 1)
        // It sleeps on the shared word until the nearest deadline left, not the ones that ended.
        #expect(round.sleep == .sharedWord(until: Self.at(100)))
        machine.woke()
        let next = machine.round(watch: ("word", 6), clock: { Self.at(100) })
        #expect(next.expired == ["current"])
        #expect(next.sleep == .sharedWord(until: Self.at(300)))
    }

    @Test("a wait wakes the sleeping thread only when it must: a first start, an earlier deadline, a watcher while it sleeps on its private word")
    func wakesOnlyWhenNeeded() {
        var machine = Machine(watching: .always)
        guard case .registered(.start) = machine.add(id: 1, seen: nil, deadline: Self.at(200), resumption: "a") else {
            Issue.record("the first wait must start the thread")
            return
        }
        // No word to watch: the private word, until the deadline.
        #expect(machine.round(watch: nil, clock: { Self.at(0) }).sleep == .privateWord(until: Self.at(200)))
        guard case .registered(.none) = machine.add(id: 2, seen: nil, deadline: Self.at(300), resumption: "later") else {
            Issue.record("a later deadline must not wake the thread")
            return
        }
        guard case .registered(.privateWord) = machine.add(id: 3, seen: nil, deadline: Self.at(100), resumption: "earlier") else {
            Issue.record("an earlier deadline must wake the thread")
            return
        }
        // Woken already (running): the next wait needs no second wake-up.
        guard case .registered(.none) = machine.add(id: 4, seen: nil, deadline: Self.at(10), resumption: "earliest") else {
            Issue.record("a running thread looks at every wait before it sleeps")
            return
        }
        machine.woke()
        #expect(machine.round(watch: nil, clock: { Self.at(20) }).expired == ["earliest"])
        guard case .registered(.privateWord) = machine.add(id: 5, seen: 0, deadline: nil, resumption: "watcher") else {
            Issue.record("a watcher must move the thread to the shared word")
            return
        }
        machine.woke()
        #expect(machine.round(watch: ("word", 0), clock: { Self.at(30) }).sleep == .sharedWord(until: Self.at(100)))
        guard case .registered(.sharedWord("word")) = machine.add(id: 6, seen: 0, deadline: Self.at(40), resumption: "soon") else {
            Issue.record("an earlier deadline rings the shared word the thread sleeps on")
            return
        }
    }

    @Test("a round reads the clock only when a wait has a deadline or the thread lingers (a signal thread's rounds never do)")
    func clockOnlyWhenNeeded() {
        var machine = Machine(watching: .always)
        _ = machine.add(id: 1, seen: 0, deadline: nil, resumption: "a")
        let round = machine.round(watch: ("word", 0), clock: {
            Issue.record("the clock was read")
            return 0
        })
        #expect(round.sleep == .sharedWord(until: nil))
    }

    @Test("a removed (cancelled) wait never ends again; the others stay")
    func removedWaitIsGone() {
        var machine = Machine(watching: .always)
        _ = machine.add(id: 1, seen: 0, deadline: Self.at(50), resumption: "cancelled")
        _ = machine.add(id: 2, seen: 0, deadline: Self.at(50), resumption: "kept")
        let removed = machine.remove(1)
        #expect(removed?.resumption == "cancelled")
        #expect(removed?.watched == true)
        #expect(machine.remove(1) == nil)
        #expect(machine.watchers == 1)
        let round = machine.round(watch: ("word", 1), clock: { Self.at(60) })
        #expect(round.ready == ["kept"])
        #expect(round.expired.isEmpty)
    }

    @Test("a doorbell thread lingers on the shared word after its last watcher, then sleeps on its private word")
    func lingersThenIdles() {
        var machine = Machine(watching: .whileWaited(linger: Self.at(50)))
        _ = machine.add(id: 1, seen: 0, deadline: nil, resumption: "a")
        #expect(machine.round(watch: ("word", 0), clock: { Self.at(0) }).sleep == .sharedWord(until: nil))
        machine.woke()
        let rung = machine.round(watch: ("word", 1), clock: { Self.at(10) })
        #expect(rung.ready == ["a"])
        #expect(rung.sleep == .sharedWord(until: Self.at(60)))
        machine.woke()
        #expect(machine.round(watch: ("word", 1), clock: { Self.at(30) }).sleep == .sharedWord(until: Self.at(60)))
        machine.woke()
        #expect(machine.round(watch: ("word", 1), clock: { Self.at(60) }).sleep == .privateWord(until: nil))
        guard case .registered(.privateWord) = machine.add(id: 2, seen: 1, deadline: nil, resumption: "b") else {
            Issue.record("a watcher must wake a thread that sleeps on its private word")
            return
        }
    }

    @Test("shutdown abandons the waits left and refuses new ones")
    func shutdownAbandons() {
        var machine = Machine(watching: .always)
        _ = machine.add(id: 1, seen: 0, deadline: nil, resumption: "left")
        _ = machine.round(watch: ("word", 0), clock: { Self.at(0) })
        guard case .sharedWord("word") = machine.shutdown() else {
            Issue.record("shutdown must wake the sleeping thread")
            return
        }
        let round = machine.round(watch: ("word", 0), clock: { Self.at(1) })
        #expect(round.abandoned == ["left"])
        #expect(round.endedWatches == 1)
        #expect(round.sleep == .exit)
        guard case .refused = machine.add(id: 2, seen: nil, deadline: nil, resumption: "late") else {
            Issue.record("a stopped thread must refuse waits")
            return
        }
    }

    // MARK: One thread, many waits

    /// Two words of private memory, kept allocated while a thread may sleep on them.
    final class TestWords: @unchecked Sendable {
        // @unchecked: the words are touched only with atomics.
        let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 2)
        init() { word.initialize(repeating: 0, count: 2) }
        deinit { word.deallocate() }
    }

    /// A word in private memory rung like a channel doorbell (generation = value / 256).
    final class TestBell: KernelWaitSource, @unchecked Sendable {
        // @unchecked: `word` and `sleepers` are touched only with atomics.
        let memory = TestWords()
        var word: UnsafeMutablePointer<UInt32> { memory.word }
        var sleepers: UnsafeMutablePointer<UInt32> { word + 1 }
        let thread: KernelWaitThread

        init(threadName: String = "baton-test-wait") {
            thread = KernelWaitThread(name: threadName, watching: .whileWaited(linger: 20_000_000))
            thread.attach(self)
        }

        var generation: UInt32 { baton_load32(word) / 256 }

        func ring() {
            baton_add32(word, 256)
            AddressWait.wakeAll(word)
        }

        func wait(after seen: UInt32, deadline: Deadline) async throws {
            try await thread.wait(after: seen, deadline: deadline)
        }

        func beginWait(after seen: UInt32) -> Bool {
            baton_add32(sleepers, 1)
            if generation == seen { return true }
            baton_sub32(sleepers, 1)
            return false
        }

        func prepareToSleep() -> KernelWaitWatch? {
            let current = baton_load32(word)
            return KernelWaitWatch(word: word, expected: current, generation: current / 256, keepAlive: memory)
        }

        func endWaits(_ count: Int) { baton_sub32(sleepers, UInt32(count)) }
    }

    enum Ending: Equatable { case rung, timedOut, cancelled, other }

    static func ending(_ body: () async throws -> Void) async -> (Ending, Duration) {
        let start = ContinuousClock.now
        do {
            try await body()
            return (.rung, ContinuousClock.now - start)
        } catch let error as BatonError where error.code == .timedOut {
            return (.timedOut, ContinuousClock.now - start)
        } catch is CancellationError {
            return (.cancelled, ContinuousClock.now - start)
        } catch {
            return (.other, ContinuousClock.now - start)
        }
    }

    /// How many of this process's threads are named `name` (Linux: `/proc/self/task/*/comm`).
    static func threads(named name: String) -> Int {
        ProcessThreads.all().filter { $0.name == name }.count
    }

    @Test("the thread does not keep its source alive while it sleeps, and ends once the source is gone: the waits left end with CancellationError")
    func threadEndsWithItsSource() async throws {
        let name = "baton-test-gone" // this test's alone (15 bytes, the most a thread name keeps)
        var bell: TestBell? = TestBell(threadName: name)
        weak let gone = bell
        let thread = try #require(bell?.thread)
        // A wait on the thread alone (a deadline-only wait, no deadline): it holds the thread,
        // not the source.
        let waiting = Task { await Self.ending { try await thread.wait(after: nil, deadline: .never) } }
        let watchdog = Task {
            try await Task.sleep(for: .seconds(30))
            waiting.cancel()
        }
        defer { watchdog.cancel() }
        let start = ContinuousClock.now
        while thread.registered < 1 || Self.threads(named: name) < 1, ContinuousClock.now - start < .seconds(30) {
            try await Task.sleep(for: .milliseconds(5))
        }
        try #require(thread.registered == 1)
        try #require(Self.threads(named: name) == 1)
        bell = nil
        #expect(gone == nil, "the sleeping thread keeps its source alive")
        // A source's deinit shuts the thread down (which wakes it); this one only goes, so wake
        // the thread as any change would: its round finds the source gone and ends it.
        thread.wake()
        let (ending, elapsed) = await waiting.value
        #expect(ending == .cancelled)
        #expect(elapsed < .seconds(30), "the wait ended only by the watchdog's cancellation")
        while Self.threads(named: name) > 0, ContinuousClock.now - start < .seconds(60) {
            try await Task.sleep(for: .milliseconds(5))
        }
        #expect(Self.threads(named: name) == 0)
        // A stopped thread refuses new waits at once (a running one would end this one at its
        // deadline).
        let (late, _) = await Self.ending { try await thread.wait(after: nil, deadline: .after(.seconds(5))) }
        #expect(late == .cancelled)
    }

    @Test("many waits on one thread: each times out at its own deadline, the others wake on the ring, a cancelled one leaves the rest waiting")
    func manyWaitsOnOneThread() async throws {
        try await withTaskExecutorPreference(ChannelExecutor.shared) { try await manyWaitsOnOneThreadBody() }
    }

    private func manyWaitsOnOneThreadBody() async throws {
        let bell = TestBell()
        let seen = bell.generation
        // Far from the registrations below: in a full parallel run on two cores, tests that
        // block pool threads delayed these tasks' start by several seconds (3 s was too short).
        // The tasks run on a thread of their own (the channel executor), not the cooperative
        // pool: in a full parallel run, tests that block the pool's two threads delayed their
        // start past the first deadline.
        let own = ChannelExecutor.shared
        let deadlines: [Int] = [20_000, 20_250, 20_500, 20_750]
        let timed = deadlines.map { milliseconds in
            Task(executorPreference: own) { await Self.ending { try await bell.wait(after: seen, deadline: .after(.milliseconds(milliseconds))) } }
        }
        let ringers = (0..<4).map { _ in Task(executorPreference: own) { await Self.ending { try await bell.wait(after: seen, deadline: .after(.seconds(120))) } } }
        let cancelled = Task(executorPreference: own) { await Self.ending { try await bell.wait(after: seen, deadline: .never) } }
        // A broken thread fails this test instead of hanging it.
        let watchdog = Task {
            try await Task.sleep(for: .seconds(90))
            for task in timed + ringers + [cancelled] { task.cancel() }
        }
        defer { watchdog.cancel() }
        // Every wait has registered (counted itself) before anything ends.
        let start = ContinuousClock.now
        while baton_load32(bell.sleepers) < UInt32(deadlines.count + ringers.count + 1), ContinuousClock.now - start < .seconds(30) {
            try await Task.sleep(for: .milliseconds(5))
        }
        try #require(bell.thread.registered == deadlines.count + ringers.count + 1)
        cancelled.cancel()
        let (cancelledEnding, cancelledAfter) = await cancelled.value
        #expect(cancelledEnding == .cancelled)
        #expect(cancelledAfter < .seconds(30))
        // The cancellation ended that wait alone: the others are still registered (a wait
        // dropped here would never be resumed, so stop rather than hang).
        try #require(bell.thread.registered == deadlines.count + ringers.count)

        // The waits with deadlines end one by one, each at its own deadline, never before it.
        for (task, milliseconds) in zip(timed, deadlines) {
            let (ending, elapsed) = await task.value
            #expect(ending == .timedOut)
            #expect(elapsed >= .milliseconds(milliseconds))
            #expect(elapsed < .milliseconds(milliseconds) + .seconds(30))
        }
        // The cancellation and the deadlines woke none of the waits for the ring.
        #expect(baton_load32(bell.sleepers) == UInt32(ringers.count))
        try #require(bell.thread.registered == ringers.count)
        bell.ring()
        for task in ringers {
            let (ending, elapsed) = await task.value
            #expect(ending == .rung)
            #expect(elapsed < .seconds(60))
        }
        #expect(baton_load32(bell.sleepers) == 0)
        bell.thread.shutdown()
    }

    @Test("a wait whose generation moved before it registered ends at once; a wait on an older ring is not woken by a kick")
    func generationsAndKicks() async throws {
        let bell = TestBell()
        let old = bell.generation
        bell.ring()
        let (stale, _) = await Self.ending { try await bell.wait(after: old, deadline: .after(.seconds(60))) }
        #expect(stale == .rung)
        let current = bell.generation
        let waiting = Task { await Self.ending { try await bell.wait(after: current, deadline: .after(.milliseconds(300))) } }
        let start = ContinuousClock.now
        while baton_load32(bell.sleepers) < 1, ContinuousClock.now - start < .seconds(30) { try await Task.sleep(for: .milliseconds(5)) }
        // A wake of the thread (an earlier deadline elsewhere, a source change) is not a ring.
        bell.thread.wake()
        _ = bell.thread.schedule(at: .now + .milliseconds(20)) {}
        let (ending, elapsed) = await waiting.value
        #expect(ending == .timedOut)
        #expect(elapsed >= .milliseconds(300))
        bell.thread.shutdown()
    }

    @Test("a wait on a generation the sleeping thread has already seen move ends at once (the last look is one step with the registration)")
    func ringBeforeRegistrationIsNotLost() async throws {
        let bell = TestBell()
        let before = bell.generation
        bell.ring()
        // Another wait (no deadline) keeps the thread asleep on the word, with no timeout,
        // having seen that ring.
        let current = bell.generation
        let other = Task { await Self.ending { try await bell.wait(after: current, deadline: .never) } }
        let start = ContinuousClock.now
        while bell.thread.registered < 1, ContinuousClock.now - start < .seconds(30) { try await Task.sleep(for: .milliseconds(5)) }
        try await Task.sleep(for: .milliseconds(50))
        // A wait whose snapshot predates the ring (taken before its caller checked its
        // condition), without a deadline that would make the thread look again: nothing will
        // ring again, so only its last look can end it (a watchdog cancels it otherwise).
        // The watchdog's 3 s count from the moment the stale wait's task runs: counted from its
        // creation, they ran out on a loaded runner before the cooperative pool ran the task.
        let (began, beganContinuation) = AsyncStream<Void>.makeStream()
        let stale = Task {
            beganContinuation.yield()
            return await Self.ending { try await bell.wait(after: before, deadline: .never) }
        }
        let watchdog = Task {
            for await _ in began { break }
            try await Task.sleep(for: .seconds(3))
            stale.cancel()
        }
        let (ending, _) = await stale.value
        watchdog.cancel()
        #expect(ending == .rung)
        other.cancel()
        #expect(await other.value.0 == .cancelled)
        #expect(baton_load32(bell.sleepers) == 0)
        bell.thread.shutdown()
    }

    @Test("scheduled callbacks fire at their own deadlines in order; a cancelled one never fires")
    func callbacksAtDeadlines() async throws {
        let thread = KernelWaitThread(name: "baton-test-timer")
        let fired = Mutex<[(Int, ContinuousClock.Instant)]>([])
        let start = ContinuousClock.now
        // Scheduled latest first: each earlier one must wake the thread again.
        for milliseconds in [300, 200, 100] {
            thread.schedule(at: start + .milliseconds(milliseconds)) { fired.withLock { $0.append((milliseconds, .now)) } }
        }
        let dropped = thread.schedule(at: start + .milliseconds(150)) { fired.withLock { $0.append((150, .now)) } }
        thread.cancel(dropped)
        while fired.withLock({ $0.count }) < 3, ContinuousClock.now - start < .seconds(60) { try await Task.sleep(for: .milliseconds(10)) }
        try await Task.sleep(for: .milliseconds(100))
        let result = fired.withLock { $0 }
        #expect(result.map(\.0) == [100, 200, 300])
        for (milliseconds, when) in result { #expect(when - start >= .milliseconds(milliseconds)) }
        thread.shutdown()
    }

    /// The kernel release as (major, minor), from uname(2).
    static var kernelVersion: (Int, Int) {
        var name = utsname()
        uname(&name)
        let release = withUnsafeBytes(of: &name.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        let parts = release.split(whereSeparator: { !$0.isNumber }).prefix(2).compactMap { Int($0) }
        return (parts.first ?? 0, parts.count > 1 ? parts[1] : 0)
    }

    /// The thread asks for prompt wake-ups (``PromptWakeUps``): on Linux 6.12 and later its
    /// time slice is the 0.1 ms it asked for, where a plain thread of the same process has the
    /// default one; the request changes neither its nice value nor its policy. (Older kernels
    /// ignore the request: then both slices are the default.)
    @Test("a kernel-wait thread runs with the short time slice that lets its wake-ups preempt CPU-bound work")
    func kernelWaitThreadAsksForPromptWakeUps() async throws {
        let thread = KernelWaitThread(name: "baton-test-slice")
        let seen = Mutex<(slice: UInt64, nice: Int32)?>(nil)
        thread.schedule(at: .now) { seen.withLock { $0 = (PromptWakeUps.currentSliceNanoseconds, getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)) } }
        let start = ContinuousClock.now
        while seen.withLock({ $0 }) == nil, ContinuousClock.now - start < .seconds(60) { try await Task.sleep(for: .milliseconds(10)) }
        thread.shutdown()
        let inside = try #require(seen.withLock { $0 })
        let plain = Mutex<UInt64>(0)
        let other = Thread { plain.withLock { $0 = PromptWakeUps.currentSliceNanoseconds } }
        other.start()
        while plain.withLock({ $0 }) == 0, ContinuousClock.now - start < .seconds(60) { try await Task.sleep(for: .milliseconds(10)) }
        let version = Self.kernelVersion
        if version >= (6, 12) {
            #expect(inside.slice == PromptWakeUps.sliceNanoseconds)
            #expect(plain.withLock { $0 } > PromptWakeUps.sliceNanoseconds, "a plain thread keeps the default slice")
        } else {
            #expect(inside.slice == plain.withLock { $0 }, "Linux \(version) has no per-task slice")
        }
        #expect(inside.nice == getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0))
    }

    /// The channel executor's thread is woken by rings as a kernel-wait thread is: it asks for
    /// the same prompt wake-ups.
    @Test("the channel executor's thread runs with the short time slice too")
    func channelExecutorAsksForPromptWakeUps() async throws {
        let channel = SharedChannel<Int>(capacity: .unbounded)
        let slice = await Task(executorPreference: channel.executor) { PromptWakeUps.currentSliceNanoseconds }.value
        if Self.kernelVersion >= (6, 12) {
            #expect(slice == PromptWakeUps.sliceNanoseconds)
        } else {
            #expect(slice > 0)
        }
    }
}
