import CBatonShims
import Synchronization

/// The channel executor: a `TaskExecutor` with one thread per process that runs the tasks that
/// prefer it and sleeps in the kernel on the channel word one of them waits for.
///
/// A channel wait made anywhere else suspends on a continuation that the doorbell's
/// ``KernelWaitThread`` resumes: the kernel wakes that thread, which hands the task to the
/// cooperative pool, which wakes a second thread to run it. Under load each of those wake-ups
/// waits for a core. A wait made on this executor's thread (by a task inside
/// `withTaskExecutorPreference(channel.executor) { ... }`) is instead registered here, and the
/// executor's thread itself sleeps on the doorbell's word: the ring that moves the word wakes
/// the thread that runs the task, one wake-up per hop, like a blocking `mq_receive`.
///
/// One such wait at a time: a second task on the executor that waits while the first one does
/// (or a `select` over several channels, whose waits run in child tasks) waits through the
/// doorbells' threads as anywhere else, and is resumed here through the job queue. While no other
/// job is queued, the thread sleeps inside the waiting task's job, without suspending it (the
/// cheaper way: no continuation, no second pass of the run loop); a job queued from another
/// thread, or a cancellation, moves the word and ends that sleep. The thread
/// starts on the first job and ends after ``idleExit`` with nothing to run and nothing to wait
/// for.
final class ChannelExecutor: TaskExecutor, @unchecked Sendable {
    // @unchecked: everything mutable is in `state` (a Mutex); `privateWord` is touched only with
    // atomics; the shared words are kept mapped by the `keepAlive` held beside them.

    /// The process's channel executor.
    static let shared = ChannelExecutor()

    /// How long the thread stays with nothing to run and nothing to wait for before it ends.
    static let idleExit: Duration = .seconds(2)
    private static let idleExitNanoseconds = idleExit.nanoseconds

    private struct Wait {
        let id: UInt64
        let doorbell: ChannelDoorbell
        let seen: UInt32
        let deadline: Deadline
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var jobs: [UnownedJob] = []
        var wait: Wait?
        var running = false
        /// The shared word the thread sleeps on (or is about to), with what keeps it mapped.
        var sleepingOn: (word: UnsafeMutablePointer<UInt32>, keepAlive: AnyObject)?
        var nextID: UInt64 = 0
    }

    private let state = Mutex(State())
    /// Rings deferred by the task running on the thread (``deferRings(of:bits:token:)``): touched
    /// only on the executor's thread.
    private var deferred: [(log: ChannelLog, bits: UInt32, token: UInt64)] = []
    /// How many waits the thread has slept on itself, inline or registered (for tests and
    /// diagnostics).
    private let registeredWaits = Atomic<Int>(0)
    var waitsRegistered: Int { registeredWaits.load(ordering: .relaxed) }
    /// Bumped by every job queued from another thread: the thread sleeps on it when it has no
    /// wait to sleep on.
    private let privateWord: UnsafeMutablePointer<UInt32>

    private init() {
        privateWord = .allocate(capacity: 1)
        privateWord.initialize(to: 0)
    }

    deinit { privateWord.deallocate() }

    /// Whether the calling thread is this executor's.
    private var isCurrent: Bool {
        baton_thread_context() == UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque())
    }

    /// Test support: whether the calling thread is this executor's.
    var isCurrentForTesting: Bool { isCurrent }

    // MARK: TaskExecutor

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let onThread = isCurrent
        let (start, sleepingOn) = state.withLock { state -> (Bool, (word: UnsafeMutablePointer<UInt32>, keepAlive: AnyObject)?) in
            state.jobs.append(job)
            if !state.running {
                state.running = true
                return (true, nil)
            }
            return (false, state.sleepingOn)
        }
        if start {
            KernelThread.spawn(name: "baton-channels") { [self] in run() }
            return
        }
        // The thread picks the job up on its next pass; it needs waking only from another thread.
        if onThread { return }
        baton_add32(privateWord, 1)
        AddressWait.wakeAll(privateWord)
        if let sleepingOn { Self.nudge(sleepingOn) }
    }

    /// Ends the thread's sleep on the shared word it sleeps on (or is about to): a step of 1 is
    /// not a ring (see ``ChannelDoorbell``), it only ends the sleep, here and (spuriously,
    /// harmlessly) in any other process's thread sleeping on the same word.
    private static func nudge(_ sleepingOn: (word: UnsafeMutablePointer<UInt32>, keepAlive: AnyObject)) {
        withExtendedLifetime(sleepingOn.keepAlive) {
            baton_add32(sleepingOn.word, 1)
            AddressWait.wakeAll(sleepingOn.word)
        }
    }

    // MARK: Deferred rings

    /// Keeps the rings a channel operation owes (`bits`: 1 readable, 2 writable; recorded in the
    /// header as owed by `token`) until the task that made them waits or suspends, when called on
    /// this executor's thread and a ring would wake a waiter that went to sleep on this
    /// processor: `false` otherwise, and the caller rings now.
    ///
    /// In a conversation on one processor (two processes that the scheduler put on the same core,
    /// as it does on a loaded machine) a ring made in the middle of a task wakes the peer, which
    /// preempts the ringer at once; the ringer runs again only to reach its own wait, two context
    /// switches more per hand-off. Deferred to the moment the ringer waits, one ring wakes the
    /// peer for everything the ringer did (an element taken *and* the next one sent), and the
    /// processor passes from one to the other once each way, as in a blocking `mq_send` and
    /// `mq_receive`. Go's scheduler does the same with a goroutine it readies (`runnext`: it runs
    /// when the readier blocks). The rings are made before any spin or sleep of this thread and
    /// after each job (so a task that suspends for anything else, or ends, makes them too); the
    /// owed-rings record in the header keeps them safe from a death meanwhile. A rendezvous wait
    /// makes them before it reads the doorbell it waits on, so that its own rings never end
    /// its wait (see `SharedChannel.waitForCounterpart`).
    ///
    /// A peer on another processor gains nothing from the wait and would lose the time until it
    /// (its spin sees the ring later, its wake-up starts later), and a ring that wakes nobody
    /// costs no system call: so a doorbell's ring waits only when a waiter counts itself asleep
    /// on it and the last one to do so went to sleep on this processor
    /// (``ChannelDoorbell/wouldWakeSleeperHere``). (Rings are independent: a waiter looks at its
    /// condition again whatever woke it, so their order does not matter.)
    static func deferRings(of log: ChannelLog, bits: UInt32, token: UInt64) -> Bool {
        let executor = shared
        guard executor.isCurrent else { return false }
        guard log.defersRingsAlways.load(ordering: .relaxed)
              || (bits & 1 == 0 || log.readable.wouldWakeSleeperHere) && (bits & 2 == 0 || log.writable.wouldWakeSleeperHere)
        else { return false }
        if let index = executor.deferred.firstIndex(where: { $0.log === log }) {
            executor.deferred[index].bits |= bits
            executor.deferred[index].token = token
        } else {
            executor.deferred.append((log, bits, token))
        }
        return true
    }

    /// Makes the rings deferred on this thread (nothing elsewhere, or when none are owed). Called
    /// before a channel wait spins; a wait that sleeps suspends its task first, and the run loop
    /// makes the rings when that job ends, before the thread sleeps.
    static func makeDeferredRings() {
        let executor = shared
        guard executor.isCurrent, !executor.deferred.isEmpty else { return }
        executor.ringDeferred()
    }

    /// Makes the deferred rings (on the executor's thread).
    private func ringDeferred() {
        while !deferred.isEmpty {
            let rings = deferred
            deferred.removeAll(keepingCapacity: true)
            for ring in rings { ring.log.makeOwedRings(ring.bits, token: ring.token) }
        }
    }

    // MARK: Waiting

    /// Waits here for `doorbell` to ring past `seen` when the caller runs on this executor's
    /// thread and no other task's wait is registered: `false` (at once, without suspending)
    /// otherwise, and the caller waits through the doorbell's thread.
    ///
    /// The thread sleeps inside the task's job while nothing else needs it
    /// (``sleepInline(_:after:deadline:)``); when something does, the wait is registered and
    /// the task suspends, and the thread sleeps on the word between jobs.
    /// - Throws: `timedOut` at the deadline, `CancellationError` when the task is cancelled.
    nonisolated(nonsending) static func waitIfCurrent(_ doorbell: ChannelDoorbell, after seen: UInt32, deadline: Deadline) async throws -> Bool {
        let executor = shared
        guard executor.isCurrent else { return false }
        let moved = await withTaskCancellationHandler {
            executor.sleepInline(doorbell, after: seen, deadline: deadline)
        } onCancel: {
            executor.interruptInlineSleep()
        }
        if moved { return true }
        guard let id = executor.state.withLock({ state -> UInt64? in
            guard state.wait == nil else { return nil }
            state.nextID += 1
            return state.nextID
        }) else { return false }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                // Counted as a sleeper before the last look (see ``ChannelDoorbell/ring()``); the
                // wait is uncounted by whoever ends it (the thread's pass or `cancel`).
                guard doorbell.beginWait(after: seen) else {
                    continuation.resume()
                    return
                }
                let registered = executor.state.withLock { state -> Bool in
                    // This runs on the executor's thread, inside a job: no other task can have
                    // taken the slot since the check above.
                    guard !Task.isCancelled, state.wait == nil else { return false }
                    state.wait = Wait(id: id, doorbell: doorbell, seen: seen, deadline: deadline, continuation: continuation)
                    return true
                }
                if registered {
                    executor.registeredWaits.add(1, ordering: .relaxed)
                } else {
                    doorbell.endWaits(1)
                    continuation.resume(throwing: CancellationError())
                }
            }
        } onCancel: {
            executor.cancel(id)
        }
        return true
    }

    /// Sleeps on `doorbell`'s word right here, inside the job of the task that waits, when
    /// nothing else is queued or registered on this executor: `true` when the word moved past
    /// `seen`; `false` when the caller must wait the general way (registered, suspended), because
    /// another job came, the task was cancelled, or the deadline passed.
    ///
    /// The thread would sleep on this very word once the task suspended; sleeping before it
    /// suspends saves the suspension and the resumption (a continuation, the job queued again, a
    /// pass of the run loop), about a sixth of the processor time of a conversation's turn
    /// (measured: 6.9 µs a side per rendezvous round trip on one processor, 5.7 µs inline). A job
    /// queued meanwhile from another thread ends the sleep (``enqueue(_:)`` wakes the word
    /// published in `sleepingOn`), and so does a cancellation (``interruptInlineSleep()``).
    private func sleepInline(_ doorbell: ChannelDoorbell, after seen: UInt32, deadline: Deadline) -> Bool {
        // What this task rang goes first: it is what the peer answers.
        if !deferred.isEmpty { ringDeferred() }
        let raw = doorbell.rawWord
        if raw / ChannelDoorbell.ringStep != seen { return true }
        let published = state.withLock { state -> Bool in
            guard state.jobs.isEmpty, state.wait == nil else { return false }
            state.sleepingOn = (doorbell.word, doorbell.memory)
            return true
        }
        guard published else { return false }
        defer { state.withLock { $0.sleepingOn = nil } }
        // After publishing: a cancellation from now on moves the word (the handler reads
        // `sleepingOn`); one before it is seen here.
        guard !Task.isCancelled else { return false }
        // Counted as a sleeper before the last look (see ``ChannelDoorbell/ring()``).
        guard doorbell.beginWait(after: seen) else { return true }
        defer { doorbell.endWaits(1) }
        registeredWaits.add(1, ordering: .relaxed)
        _ = AddressWait.wait(on: doorbell.word, expecting: raw, timeoutNanoseconds: deadline.sleepTimeout)
        return doorbell.snapshot() != seen
    }

    /// Ends an inline sleep (its task was cancelled).
    private func interruptInlineSleep() {
        if let sleepingOn = state.withLock({ $0.sleepingOn }) { Self.nudge(sleepingOn) }
    }

    /// Ends the wait `id` with `CancellationError` if it is still registered (any thread).
    private func cancel(_ id: UInt64) {
        let wait = state.withLock { state -> Wait? in
            guard let wait = state.wait, wait.id == id else { return nil }
            state.wait = nil
            return wait
        }
        guard let wait else { return }
        wait.doorbell.endWaits(1)
        // The resumed task is queued here, which wakes the thread from its sleep on the word.
        wait.continuation.resume(throwing: CancellationError())
    }

    // MARK: The thread

    private enum Pass {
        case run([UnownedJob])
        case end(Wait, (any Error)?)
        case sleep(word: UnsafeMutablePointer<UInt32>, expected: UInt32, deadline: Deadline, keepAlive: AnyObject)
        /// Until the time `until` (``KernelWaitThread/now()``'s base).
        case idle(until: Int64)
        case exit
    }

    private func run() {
        // Its wake-ups are the rings of a conversation: they should preempt CPU-bound work at
        // once (the tasks it runs are short by contract: see ``SharedChannel/executor``).
        PromptWakeUps.requestForCurrentThread()
        baton_set_thread_context(UnsafeMutableRawPointer(Unmanaged.passUnretained(self).toOpaque()))
        defer { baton_set_thread_context(nil) }
        let unowned = asUnownedTaskExecutor()
        // Times on the wait threads' base (plain nanoseconds, no clock types in the loop).
        var busy = KernelWaitThread.now()
        while true {
            // Read before the pass: a job queued after it bumps the word, so the sleep below
            // ends at once.
            let privateSeen = baton_load32(privateWord)
            let now = KernelWaitThread.now()
            let pass = state.withLock { state -> Pass in
                if !state.jobs.isEmpty {
                    defer { state.jobs.removeAll(keepingCapacity: true) }
                    return .run(state.jobs)
                }
                guard let wait = state.wait else {
                    if now &- busy >= Self.idleExitNanoseconds {
                        state.running = false
                        return .exit
                    }
                    return .idle(until: busy &+ Self.idleExitNanoseconds)
                }
                let raw = wait.doorbell.rawWord
                if raw / ChannelDoorbell.ringStep != wait.seen {
                    state.wait = nil
                    return .end(wait, nil)
                }
                if wait.deadline.hasPassed(at: now) {
                    state.wait = nil
                    return .end(wait, ChannelDoorbell.timedOut())
                }
                // Published under the lock: a job queued from now on rings this word.
                state.sleepingOn = (wait.doorbell.word, wait.doorbell.memory)
                return .sleep(word: wait.doorbell.word, expected: raw, deadline: wait.deadline, keepAlive: wait.doorbell.memory)
            }
            switch pass {
            case .run(let jobs):
                for job in jobs {
                    job.runSynchronously(on: unowned)
                    // The job ended (its task suspended or finished): what it rang goes now.
                    if !deferred.isEmpty { ringDeferred() }
                }
                busy = KernelWaitThread.now()
            case .end(let wait, let error):
                wait.doorbell.endWaits(1)
                // The task prefers this executor: resuming it queues its job here.
                if let error { wait.continuation.resume(throwing: error) } else { wait.continuation.resume() }
            case .sleep(let word, let expected, let deadline, let keepAlive):
                if baton_load32(privateWord) == privateSeen {
                    withExtendedLifetime(keepAlive) {
                        _ = AddressWait.wait(on: word, expecting: expected, timeoutNanoseconds: deadline.sleepTimeout)
                    }
                }
                state.withLock { $0.sleepingOn = nil }
                busy = KernelWaitThread.now()
            case .idle(let until):
                if baton_load32(privateWord) == privateSeen {
                    _ = AddressWait.wait(on: privateWord, expecting: privateSeen, timeoutNanoseconds: KernelWaitThread.timeout(until: until))
                }
            case .exit:
                return
            }
        }
    }
}
