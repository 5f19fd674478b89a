import CBatonShims
import Synchronization

/// A word in a channel's header that every state change of one kind rings ("an element
/// arrived", "room was made"), and the ``KernelWaitThread`` (one per process and word) that
/// sleeps on it while local tasks wait, resuming them when the word moves or their deadline
/// passes.
///
/// Waiting tasks never park a thread: they suspend on a continuation. A waiter reads the word
/// (``snapshot()``) *before* checking its condition and waits for the word to move past that
/// value, so a change made after the check is never missed. Before it suspends, a waiter watches
/// the word for a few microseconds (``spin(after:)``, an adaptive, bounded spin like glibc's
/// adaptive mutex): in a conversation between two running processes the answer usually comes
/// within that time, and a wait that ends there costs neither side a system call. It does not
/// spin when the last ring came from the processor it runs on: the ringer cannot run there while
/// the waiter spins (on one processor, a spin only delays the answer it waits for). A waiter that
/// suspends counts itself in the header's sleeper count (across processes) before it checks the
/// word a last time, and the ringer reads that count after it moved the word: so the ringer
/// makes the wake system call (``AddressWait``) only when some task may be asleep, and never
/// misses one. The thread keeps sleeping on the shared word for ``linger`` after its last waiter
/// left, then on its private word until a task waits again. Deadlines are the thread's wait
/// timeouts: no timer task per wait.
final class ChannelDoorbell: KernelWaitSource, @unchecked Sendable {
    // @unchecked: `word` and `sleepers` point into the channel header, which `memory` keeps
    // mapped for as long as this doorbell (and the watches its thread sleeps on) lives; they are
    // touched only with atomics. The spin budget is atomic; the waits are in `thread`.
    /// The word (for ``ChannelExecutor``, which sleeps on it) and what keeps it mapped.
    let word: UnsafeMutablePointer<UInt32>
    private let sleepers: UnsafeMutablePointer<UInt32>
    /// The processor of the last ring, plus one (``CurrentProcessor/hint``; 0 unknown).
    private let ringer: UnsafeMutablePointer<UInt32>
    /// The processor of the last waiter to count itself a sleeper, plus one (0 unknown).
    private let sleeper: UnsafeMutablePointer<UInt32>
    let memory: ChannelHeaderMemory
    private let thread: KernelWaitThread

    /// The current spin budget in nanoseconds (see ``spin(after:)``).
    private let spinBudget = Atomic<Int>(ChannelDoorbell.maxSpin)
    /// How many waits have spun (for the periodic full-budget probe).
    private let spinCount = Atomic<Int>(0)
    /// The longest a waiter watches the word before it suspends (ns), and the shortest budget.
    static let maxSpin = 64_000
    static let minSpin = 500
    static let probeInterval = 16

    /// How long the thread keeps sleeping on the shared word after its last waiter left, so that
    /// the next wait (in a conversation, a few microseconds later) needs no wake-up of its own.
    static let linger: Duration = .milliseconds(50)

    init(_ memory: ChannelHeaderMemory, word: Int, sleepers: Int, ringer: Int, sleeper: Int, threadName: String) {
        self.memory = memory
        self.word = memory.pointer.advanced(by: word).assumingMemoryBound(to: UInt32.self)
        self.sleepers = memory.pointer.advanced(by: sleepers).assumingMemoryBound(to: UInt32.self)
        self.ringer = memory.pointer.advanced(by: ringer).assumingMemoryBound(to: UInt32.self)
        self.sleeper = memory.pointer.advanced(by: sleeper).assumingMemoryBound(to: UInt32.self)
        thread = KernelWaitThread(name: threadName, watching: .whileWaited(linger: Self.linger.nanoseconds), timedOut: Self.timedOut)
        thread.attach(self)
    }

    /// A ring adds `ringStep` to the word; the thread's own wake-ups (which only make the
    /// threads re-read their deadlines) add 1. Waiters compare the word divided by `ringStep`.
    static let ringStep: UInt32 = 256

    /// The word's value, rings and wake-ups (``ChannelExecutor`` sleeps expecting it).
    var rawWord: UInt32 { baton_load32(word) }

    /// The doorbell's ring count: read it before checking the condition you will wait for.
    func snapshot() -> UInt32 { baton_load32(word) / Self.ringStep }

    /// Rings the doorbell: call after the state change is visible (after unlocking). Makes a
    /// system call only when some task (of any process) may be asleep on the word.
    func ring() {
        let here = CurrentProcessor.hint
        if baton_load32(ringer) != here { baton_store32(ringer, here) }
        baton_add32(word, Self.ringStep)
        if baton_load32(sleepers) > 0 { AddressWait.wakeAll(word) }
    }

    /// How many waits count themselves asleep on the word (for tests and diagnostics).
    var sleeperCount: UInt32 { baton_load32(sleepers) }

    /// Whether a ring now would wake a waiter (of any process) that went to sleep on the
    /// processor the calling thread runs on: some waiter counts as a sleeper, and the last one
    /// to count itself did so here (a hint: ``CurrentProcessor``).
    var wouldWakeSleeperHere: Bool {
        guard baton_load32(sleepers) > 0 else { return false }
        let here = CurrentProcessor.hint
        return here != 0 && baton_load32(sleeper) == here
    }

    /// Watches the word for a moment: `true` when it moved past `seen` within the spin budget.
    ///
    /// The budget adapts: a spin that sees the word move restores it to ``maxSpin``; one that
    /// does not halves it (down to ``minSpin``), so a slow peer costs little CPU before the waiter
    /// sleeps in the kernel. Every ``probeInterval``-th wait spins the full ``maxSpin`` anyway, so
    /// the budget recovers once the peer answers quickly again.
    ///
    /// No spin at all when the doorbell's last ring came from the processor this thread runs on
    /// (``CurrentProcessor``): in a conversation the next ring comes from the same peer, which
    /// cannot run on this processor while the waiter spins there. (Two processes that share one
    /// processor, as on a loaded machine, would otherwise take turns wasting the spin budget.)
    func spin(after seen: UInt32) -> Bool {
        // One doorbell (every wait but a select's): no array of one to allocate per wait.
        Self.spin(budget: self, rangOnlyFrom: { baton_load32(self.ringer) == $0 }, moved: { self.snapshot() != seen })
    }

    /// ``spin(after:)`` over several doorbells at once (for `select`): `true` when any moved.
    /// The first doorbell's budget applies.
    static func spin(_ doorbells: [(doorbell: ChannelDoorbell, seen: UInt32)]) -> Bool {
        guard let first = doorbells.first?.doorbell else { return false }
        return spin(budget: first,
                    rangOnlyFrom: { here in doorbells.allSatisfy { baton_load32($0.doorbell.ringer) == here } },
                    moved: { doorbells.contains { $0.doorbell.snapshot() != $0.seen } })
    }

    /// The spin of ``spin(after:)``: `moved` says whether a watched word moved, `rangOnlyFrom`
    /// whether every watched doorbell last rang from the given processor (hint); `first` keeps
    /// the budget.
    private static func spin(budget first: ChannelDoorbell, rangOnlyFrom: (UInt32) -> Bool, moved: () -> Bool) -> Bool {
        // Rings this thread deferred go before it waits (see ``ChannelExecutor/deferRings``).
        ChannelExecutor.makeDeferredRings()
        if moved() { return true }
        let here = CurrentProcessor.hint
        if here != 0, rangOnlyFrom(here) { return false }
        let probe = first.spinCount.wrappingAdd(1, ordering: .relaxed).newValue % probeInterval == 0
        let budget = UInt64(probe ? maxSpin : first.spinBudget.load(ordering: .relaxed))
        let start = baton_monotonic_ns()
        var round = 0
        while true {
            for _ in 0..<16 { baton_cpu_relax() }
            if moved() {
                first.spinBudget.store(maxSpin, ordering: .relaxed)
                return true
            }
            round += 1
            if round & 1 == 0, baton_monotonic_ns() &- start >= budget { break }
        }
        first.spinBudget.store(max(minSpin, Int(budget) / 2), ordering: .relaxed)
        return false
    }

    /// Waits until the word moves from `seen` (a ``snapshot()`` taken before the caller checked
    /// its condition), first spinning for a moment unless `spinning` is false (the caller spun).
    /// - Throws: `timedOut` at the deadline, `CancellationError` when cancelled.
    nonisolated(nonsending) func wait(after seen: UInt32, deadline: Deadline, spinning: Bool = true) async throws {
        try Task.checkCancellation()
        if deadline.hasPassed {
            if snapshot() != seen { return }
            throw Self.timedOut()
        }
        if spinning, spin(after: seen) { return }
        // On the channel executor's thread: that thread sleeps on the word itself.
        if try await ChannelExecutor.waitIfCurrent(self, after: seen, deadline: deadline) { return }
        try await thread.wait(after: seen, deadline: deadline)
    }

    static func timedOut() -> BatonError {
        BatonError(.timedOut, "the deadline passed before the channel could proceed")
    }

    /// Stops the thread (the channel is going away).
    func shutdown() { thread.shutdown() }

    /// The thread holds its source only while it goes round: stop it (and wake it to end) when
    /// the doorbell goes, whoever held it last.
    deinit { thread.shutdown() }

    // MARK: KernelWaitSource

    func prepareToSleep() -> KernelWaitWatch? {
        let current = baton_load32(word)
        return KernelWaitWatch(word: word, expected: current, generation: current / Self.ringStep, keepAlive: memory)
    }

    /// Counts the wait as a possible sleeper before the last look at the word (see ``ring()``).
    func beginWait(after seen: UInt32) -> Bool {
        let here = CurrentProcessor.hint
        if baton_load32(sleeper) != here { baton_store32(sleeper, here) }
        baton_add32(sleepers, 1)
        if snapshot() == seen { return true }
        baton_sub32(sleepers, 1)
        return false
    }

    func endWaits(_ count: Int) {
        baton_sub32(sleepers, UInt32(count))
    }
}

/// The header of a channel (mapped from its file, or allocated for an in-process channel), kept
/// alive by the channel and by its doorbell threads.
final class ChannelHeaderMemory: @unchecked Sendable {
    // @unchecked: immutable; the memory it points to is shared and touched with atomics or
    // under the channel's lock.
    let pointer: UnsafeMutableRawPointer
    let size: Int
    private let mapped: Bool

    init(mapped pointer: UnsafeMutableRawPointer, size: Int) {
        self.pointer = pointer
        self.size = size
        self.mapped = true
    }

    init(allocating size: Int) {
        pointer = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 64)
        pointer.initializeMemory(as: UInt8.self, repeating: 0, count: size)
        self.size = size
        mapped = false
    }

    deinit {
        if mapped { Sys.munmap(pointer, size: size) } else { pointer.deallocate() }
    }
}
