#if os(Linux)
import CBatonShims
import Synchronization

/// A futex word in a channel's header that every state change of one kind rings ("an element
/// arrived", "room was made"), and the one thread per process and word that sleeps on it while
/// local tasks wait, turning each wake-up into an ``EventCounter`` notification.
///
/// Waiting tasks never park a thread: they suspend on ``events``. The thread sleeps on a
/// private word while no task of this process waits, and counts itself in the header's sleeper
/// count while it may be asleep on the shared word, so a ringer makes the `futex_wake` system
/// call only when someone may be asleep.
final class ChannelDoorbell: @unchecked Sendable {
    // @unchecked: `word` and `sleepers` point into the channel header, which `memory` keeps
    // mapped for as long as this doorbell (and so its thread) lives; they are touched only with
    // atomics.
    // `idleWord` is private memory touched with atomics. Everything else is in `state` (a Mutex).
    let events = EventCounter()
    private let word: UnsafeMutablePointer<UInt32>
    private let sleepers: UnsafeMutablePointer<UInt32>
    private let idleWord = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    private let threadName: String
    private let memory: ChannelHeaderMemory
    private let state = Mutex<(interest: Int, started: Bool, shutdown: Bool)>((0, false, false))

    init(_ memory: ChannelHeaderMemory, word: Int, sleepers: Int, threadName: String) {
        self.memory = memory
        self.word = memory.pointer.advanced(by: word).assumingMemoryBound(to: UInt32.self)
        self.sleepers = memory.pointer.advanced(by: sleepers).assumingMemoryBound(to: UInt32.self)
        self.threadName = threadName
        idleWord.initialize(to: 0)
    }

    deinit { idleWord.deallocate() }

    /// Rings the doorbell: call after the state change is visible (after unlocking).
    func ring() {
        baton_add32(word, 1)
        if baton_load32(sleepers) > 0 { _ = baton_futex_wake_all(word) }
    }

    /// Waits until the doorbell rings after `seen` (a snapshot of ``events`` taken before the
    /// caller checked its condition).
    /// - Throws: `timedOut` at the deadline, `CancellationError` when cancelled.
    func wait(after seen: UInt64, deadline: Deadline) async throws {
        beginInterest()
        defer { endInterest() }
        try await events.wait(after: seen, deadline: deadline)
    }

    private func beginInterest() {
        let (start, wakeIdle) = state.withLock { state -> (Bool, Bool) in
            state.interest += 1
            let start = !state.started
            state.started = true
            return (start, state.interest == 1 && !start)
        }
        if start {
            KernelThread.spawn(name: threadName) { [self] in self.run() }
        } else if wakeIdle {
            baton_add32(idleWord, 1)
            _ = baton_futex_wake_all(idleWord)
        }
    }

    private func endInterest() {
        state.withLock { $0.interest -= 1 }
    }

    /// Stops the thread (the channel is going away).
    func shutdown() {
        let started = state.withLock { state -> Bool in
            state.shutdown = true
            return state.started
        }
        guard started else { return }
        baton_add32(idleWord, 1)
        _ = baton_futex_wake_all(idleWord)
        ring()
    }

    private func run() {
        var counted = false
        while true {
            let idleSeen = baton_load32(idleWord)
            let (interest, shutdown) = state.withLock { ($0.interest, $0.shutdown) }
            if shutdown {
                if counted { baton_sub32(sleepers, 1) }
                return
            }
            if interest == 0 {
                if counted { baton_sub32(sleepers, 1); counted = false }
                _ = baton_futex_wait(idleWord, idleSeen, -1)
                continue
            }
            if !counted { baton_add32(sleepers, 1); counted = true }
            // Read the word, then notify: a change made after a waiter's check is either in
            // this notification or wakes the futex wait below.
            let seen = baton_load32(word)
            events.notify()
            _ = baton_futex_wait(word, seen, -1)
        }
    }
}

/// The header of a channel (mapped from its file, or allocated for an in-process channel), kept
/// alive by the channel and by its doorbell threads.
final class ChannelHeaderMemory: @unchecked Sendable {
    // @unchecked: immutable; the memory it points to is shared and touched with atomics or
    // under the channel's robust mutex.
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
#endif
