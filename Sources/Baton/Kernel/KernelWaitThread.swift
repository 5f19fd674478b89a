import CBatonShims
import Synchronization

/// What a ``KernelWaitThread`` watches besides its deadlines: a word, usually in memory shared
/// with other processes, that those processes ring (a channel doorbell, a signal-table entry).
///
/// The source owns its thread; the thread holds the source only while it goes round, never
/// while it sleeps, so a source's `deinit` runs once its owners let go: it calls the thread's
/// ``KernelWaitThread/shutdown()`` (which wakes the thread to end). What keeps the watched word
/// mapped during a sleep is the watch's `keepAlive`, not the source.
protocol KernelWaitSource: AnyObject, Sendable {
    /// Called on the thread at the start of each round, never under the thread's lock: deliver
    /// whatever arrived, then say which word to sleep on, read *before* the last look at the
    /// state it guards (so a ring after that look ends the sleep at once); `nil` when there is
    /// nothing to watch (the thread sleeps on its private word).
    func prepareToSleep() -> KernelWaitWatch?
    /// Called on the thread after each round, whether it slept or not.
    func roundEnded()
    /// A task is about to wait for the word's generation to move from `seen`: count it where
    /// the ringers look, then look at the word once more; `false` (after uncounting it) when it
    /// moved already. Called under the thread's lock, so that this look and the wait's
    /// registration are one step for the thread's rounds (which read the word before they take
    /// the lock): a ring after the look either wakes the thread or is seen by its next round.
    /// Keep it to atomics.
    func beginWait(after seen: UInt32) -> Bool
    /// `count` waits begun with ``beginWait(after:)`` ended (became ready, timed out, were
    /// cancelled or abandoned). Any thread.
    func endWaits(_ count: Int)
}

extension KernelWaitSource {
    func roundEnded() {}
    func beginWait(after seen: UInt32) -> Bool { true }
    func endWaits(_ count: Int) {}
}

/// A word for a ``KernelWaitThread`` to sleep on, as its source saw it.
struct KernelWaitWatch: @unchecked Sendable {
    // @unchecked: `word` points into memory that `keepAlive` keeps mapped; it is only touched
    // with atomics and ``AddressWait``.
    /// The word.
    var word: UnsafeMutablePointer<UInt32>
    /// Its value when the source last looked: the sleep ends at once if it moved since.
    var expected: UInt32
    /// What a waiting task's `seen` is compared with (a channel doorbell's ring count).
    var generation: UInt32
    /// What keeps `word` mapped while the thread sleeps on it (and a waker rings it).
    var keepAlive: AnyObject?
}

/// A thread that sleeps in the kernel on one word at a time (``AddressWait``, whose per-platform
/// files name the system calls) and ends the waits registered with it: each
/// one when its source's word moves past the generation it saw, at its deadline, or when its
/// task is cancelled. The one copy of that loop in the library; its clients:
///
/// - ``DeadlineTimer``: the process's timer, with no source (it sleeps on its private word
///   until the nearest deadline) and callbacks instead of tasks;
/// - ``ChannelDoorbell``: one thread per doorbell word of a channel, watching the word while
///   tasks wait on it (and lingering a moment after), resuming them when it is rung;
/// - ``SignalTable``: the process's signal thread, watching its entry's doorbell while anything
///   is observed, delivering on each wake-up and running the tasks that prefer it.
///
/// Waiting tasks never park a thread: they suspend on a continuation, registered with its
/// deadline in ``KernelWaitState`` (the rules, pure and tested on their own). No timer task,
/// no polling: deadlines are the thread's wait timeouts. The thread sleeps on its source's
/// shared word, or on a private word when there is nothing to watch. Whoever needs it to look
/// again (an earlier deadline, a first watcher while it sleeps on its private word, a change of
/// the source's state: ``wake(start:)``) bumps the private word and, when it sleeps on the
/// shared word, rings that word too (by a step that is not a ring of the source), so one sleep
/// covers both without a wait on two words at once, which Apple platforms do not offer. The
/// thread reads the private word before its round and checks it again after it published where
/// it sleeps: a wake is never lost between the two.
final class KernelWaitThread: @unchecked Sendable {
    // @unchecked: everything mutable is in `state` (a Mutex), including the weak `source`;
    // `privateWord` is private memory touched only with atomics and ``AddressWait``.

    /// What a wait ends with. (An unsafe continuation, as in ``EventCounter``: the machine hands
    /// each out once, under the thread's lock.)
    enum Resumption: Sendable {
        /// A suspended task: resumed normally when ready, with the thread's timed-out error at
        /// its deadline, with `CancellationError` when cancelled or abandoned.
        case task(UnsafeContinuation<Void, any Error>)
        /// Called on the thread at the deadline; dropped when cancelled or abandoned.
        case callback(@Sendable () -> Void)
    }

    private struct Locked {
        var machine: KernelWaitState<Resumption, KernelWaitWatch>
        weak var source: (any KernelWaitSource)?
        /// Whether a source was attached: once it is gone, the thread ends.
        var attached = false
    }

    private let name: String
    private let timedOut: @Sendable () -> any Error
    private let state: Mutex<Locked>
    private let privateWord = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    /// Wait ids, taken before the wait registers (its cancellation handler may run first).
    private let nextID = Atomic<UInt64>(0)
    private let roundCount = Atomic<UInt64>(0)

    /// - Parameters:
    ///   - name: The OS thread's name (`baton-…`).
    ///   - watching: When the thread sleeps on its source's word (see ``KernelWaitState/Watching``).
    ///   - timedOut: The error a task's wait throws at its deadline.
    init(name: String, watching: KernelWaitState<Resumption, KernelWaitWatch>.Watching = .always,
         timedOut: @escaping @Sendable () -> any Error = { BatonError(.timedOut, "the deadline passed before the awaited event") }) {
        self.name = name
        self.timedOut = timedOut
        state = Mutex(Locked(machine: KernelWaitState(watching: watching)))
        privateWord.initialize(to: 0)
    }

    deinit { privateWord.deallocate() }

    /// Sets the source whose word the thread watches (held weakly: the source owns the
    /// thread). Call once, before the first wait or wake. The thread holds the source only
    /// while it goes round, never while it sleeps, and ends in the first round that finds it
    /// gone: the source's `deinit` calls ``shutdown()``, which wakes the thread for that round.
    func attach(_ source: any KernelWaitSource) {
        state.withLock {
            $0.source = source
            $0.attached = true
        }
    }

    // MARK: Time

    /// The origin of the thread's times: they are nanoseconds since this instant of the
    /// continuous clock, plain `Int64`s that the rounds compare without the clock's types.
    private static let origin = ContinuousClock.now

    /// `instant` as nanoseconds since ``origin``.
    static func time(_ instant: ContinuousClock.Instant) -> Int64 { (instant - origin).nanoseconds }

    /// The instant `time` nanoseconds after ``origin``.
    static func instant(_ time: Int64) -> ContinuousClock.Instant { origin.advanced(by: .nanoseconds(time)) }

    /// Now, as nanoseconds since ``origin``.
    static func now() -> Int64 { time(.now) }

    /// The timeout of a kernel sleep until `time` (`nil`: none): nanoseconds, never negative,
    /// or -1 for none. The one rule for every sleep with a deadline (``Deadline/sleepTimeout``).
    package static func timeout(until time: Int64?) -> Int64 {
        guard let time else { return -1 }
        return max(0, time &- now())
    }

    // MARK: Waiting

    private enum Registration {
        case registered(KernelWaitState<Resumption, KernelWaitWatch>.Wake)
        /// The source's last look found the word moved (the wait is not registered).
        case moved(KernelWaitState<Resumption, KernelWaitWatch>.Wake)
        /// Cancelled, or the thread stopped.
        case refused
    }

    /// Suspends the task until the source's generation differs from `seen` (when given: the
    /// source counts the wait and looks once more, ``KernelWaitSource/beginWait(after:)``, and
    /// uncounts it however it ends), until `deadline`, or until the task is cancelled.
    /// - Throws: The thread's timed-out error at the deadline; `CancellationError` when the task
    ///   is cancelled (or the thread was shut down).
    nonisolated(nonsending) func wait(after seen: UInt32?, deadline: Deadline) async throws {
        let id = nextID.add(1, ordering: .relaxed).newValue
        // On the thread's time base already (``Deadline/time``).
        let time = deadline.time
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Void, any Error>) in
                let registration = state.withLock { locked -> Registration in
                    if Task.isCancelled { return .refused }
                    guard case .registered(let wake) = locked.machine.add(id: id, seen: seen, deadline: time, resumption: .task(continuation)) else {
                        return .refused
                    }
                    // (The caller is a method of the source, which holds it: this reference
                    // is never its last, so the source's deinit never runs under the lock.)
                    if let seen, let source = locked.source, !source.beginWait(after: seen) {
                        _ = locked.machine.remove(id)
                        return .moved(wake)
                    }
                    return .registered(wake)
                }
                switch registration {
                case .registered(let wake):
                    perform(wake)
                case .moved(let wake):
                    perform(wake) // a start must still happen
                    continuation.resume()
                case .refused:
                    continuation.resume(throwing: CancellationError())
                }
            }
        } onCancel: {
            cancel(id)
        }
    }

    /// Calls `fire` on the thread at `when`, unless ``cancel(_:)`` comes first.
    /// - Returns: The id to cancel it with.
    @discardableResult
    func schedule(at when: ContinuousClock.Instant, _ fire: @escaping @Sendable () -> Void) -> UInt64 {
        schedule(atTime: Self.time(when), fire)
    }

    /// ``schedule(at:_:)`` with the time on the thread's time base (``time(_:)``,
    /// ``Deadline/time``).
    @discardableResult
    func schedule(atTime time: Int64, _ fire: @escaping @Sendable () -> Void) -> UInt64 {
        let id = nextID.add(1, ordering: .relaxed).newValue
        let admission = state.withLock { $0.machine.add(id: id, seen: nil, deadline: time, resumption: .callback(fire)) }
        if case .registered(let wake) = admission { perform(wake) }
        return id
    }

    /// Ends a wait or a scheduled callback that has not ended: a task is resumed with
    /// `CancellationError`, a callback is dropped. Harmless when it already ended.
    func cancel(_ id: UInt64) {
        guard let removed = state.withLock({ $0.machine.remove(id) }) else { return }
        if removed.watched { endWaits(1) }
        if case .task(let continuation) = removed.resumption { continuation.resume(throwing: CancellationError()) }
    }

    /// Makes the thread go round once more (its source has something new: an observer, a job),
    /// starting it if `start` and it has not started.
    func wake(start: Bool = true) {
        baton_add32(privateWord, 1)
        perform(state.withLock { $0.machine.wake(start: start) })
    }

    /// Stops the thread after its current round (its source is going away); waits still
    /// registered then end with `CancellationError`.
    func shutdown() {
        baton_add32(privateWord, 1)
        perform(state.withLock { $0.machine.shutdown() })
    }

    /// How many waits and scheduled callbacks are registered now (for tests and diagnostics).
    var registered: Int { state.withLock { $0.machine.waiters.count } }

    /// How many rounds the thread went (for tests and diagnostics: each costs the source's
    /// look and, unless something is pending, a sleep).
    var rounds: UInt64 { roundCount.load(ordering: .relaxed) }

    private func endWaits(_ count: Int) {
        state.withLock { $0.source }?.endWaits(count)
    }

    private func perform(_ wake: KernelWaitState<Resumption, KernelWaitWatch>.Wake) {
        switch wake {
        case .none:
            break
        case .start:
            KernelThread.spawn(name: name) { [self] in run() }
        case .privateWord:
            baton_add32(privateWord, 1)
            AddressWait.wakeOne(privateWord)
        case .sharedWord(let watch):
            withExtendedLifetime(watch.keepAlive) {
                baton_add32(watch.word, 1)
                AddressWait.wakeAll(watch.word)
            }
        }
    }

    // MARK: The thread

    private func run() {
        PromptWakeUps.requestForCurrentThread()
        var source = state.withLock { currentSource(&$0) }
        while true {
            let privateSeen = baton_load32(privateWord)
            let next = goRound(source)
            source = nil // never held while the thread sleeps
            guard let plan = next else { return }
            // A wake after `privateSeen` either found the place published by the round and rang
            // it, or bumped the private word before this look.
            if plan.sleeps, baton_load32(privateWord) == privateSeen {
                if let word = plan.word {
                    withExtendedLifetime(plan.keepAlive) {
                        _ = AddressWait.wait(on: word, expecting: plan.expected, timeoutNanoseconds: plan.timeout)
                    }
                } else {
                    _ = AddressWait.wait(on: privateWord, expecting: privateSeen, timeoutNanoseconds: plan.timeout)
                }
            }
            handOverTrace("waitthread.woke")
            // One look under the lock for the whole of the next round: the machine learns the
            // thread is awake, and the source is loaded (one weak load a round, not two). The
            // source's `roundEnded()` follows, outside the lock (the reference may be the
            // source's last one); a wake in between finds the thread running and leaves the
            // work to the round that follows, as any wake while it runs.
            source = state.withLock { locked in
                locked.machine.woke()
                return currentSource(&locked)
            }
            source?.roundEnded()
        }
    }

    /// The source, for one round; once it is gone (after it was attached), the machine is
    /// shut down (the thread itself is awake, so there is no one to wake).
    private func currentSource(_ locked: inout Locked) -> (any KernelWaitSource)? {
        let source = locked.source
        if source == nil && locked.attached { _ = locked.machine.shutdown() }
        return source
    }

    /// One round of the thread: the source (loaded by ``run()`` for this round) delivers and
    /// says where to sleep, the waits that are due end, and the machine publishes where the
    /// thread sleeps.
    /// - Returns: Where to sleep (the source's watch, or the private word); `nil` when the
    ///   thread ends (shut down, or its source is gone).
    private func goRound(_ source: (any KernelWaitSource)?) -> SleepPlan? {
        roundCount.add(1, ordering: .relaxed)
        let watch = source?.prepareToSleep()
        let round = state.withLock { $0.machine.round(watch: watch.map { ($0, $0.generation) }, clock: Self.now) }
        if round.endedWatches > 0 { source?.endWaits(round.endedWatches) }
        for (resumption, ending) in round.ended {
            switch (resumption, ending) {
            case (.task(let continuation), .ready): continuation.resume()
            case (.task(let continuation), .expired): continuation.resume(throwing: timedOut())
            case (.task(let continuation), .abandoned): continuation.resume(throwing: CancellationError())
            case (.callback(let fire), .expired): fire()
            case (.callback, _): break // never ready (no `seen`); dropped when abandoned
            }
        }
        switch round.sleep {
        case .exit:
            source?.roundEnded()
            return nil
        case .privateWord(let until):
            return SleepPlan(word: nil, expected: 0, until: until ?? .max, keepAlive: nil)
        case .sharedWord(let until):
            guard let watch else { return SleepPlan(word: nil, expected: 0, until: .min, keepAlive: nil) }
            return SleepPlan(word: watch.word, expected: watch.expected, until: until ?? .max, keepAlive: watch.keepAlive)
        }
    }

    /// Where the thread sleeps after a round: on `word` while it holds `expected` (on the
    /// private word when `nil`), until the time `until` (`.max`: until woken; `.min`: no sleep).
    ///
    /// Four plain fields: returned as a tuple of the machine's `Sleep` and an optional
    /// ``KernelWaitWatch`` (or with an `Int64?` or a fifth field), the plan was destroyed
    /// through runtime type metadata at every round (a metadata lookup and a value-witness
    /// call, on memory that is cold by the time a signal thread wakes).
    private struct SleepPlan {
        var word: UnsafeMutablePointer<UInt32>?
        var expected: UInt32
        var until: Int64
        var keepAlive: AnyObject?

        var sleeps: Bool { until != .min }

        /// The sleep's timeout in nanoseconds (< 0: none).
        var timeout: Int64 { KernelWaitThread.timeout(until: until == .max ? nil : until) }
    }
}
