/// The state of one ``KernelWaitThread``, kept behind its lock: the waits it will end (each with
/// an optional deadline, and optionally watching the thread's shared word), where the thread
/// sleeps, and until when.
///
/// Pure: no system call, no clock read, no continuation resumed here. Each method returns what
/// its caller must do once the lock is released (start or wake the thread, resume these waits,
/// sleep there until then), so the rules are tested without threads (`KernelWaitThreadTests`).
/// Generic over what a wait resumes (`Resumption`) and over what identifies the shared word the
/// thread sleeps on (`Target`), which the thread's waker needs to ring it. Times are plain
/// nanosecond counts on one clock (``KernelWaitThread`` uses the continuous clock from a fixed
/// origin): a round touches no resilient clock type, and reads the clock only when some wait
/// has a deadline or the thread lingers.
struct KernelWaitState<Resumption, Target> {
    /// How the thread treats its source's shared word.
    enum Watching: Equatable {
        /// Sleep on it whenever the source offers it (signals: while anything is observed).
        case always
        /// Sleep on it while some wait watches it, and for `linger` nanoseconds after the last
        /// one ended, so that the next wait of a conversation, a few microseconds later, needs no
        /// wake-up of its own (channel doorbells). Otherwise sleep on the private word.
        case whileWaited(linger: Int64)
    }

    struct Waiter {
        /// The generation of the shared word the waiter saw; `nil` for a wait on the deadline alone.
        var seen: UInt32?
        var deadline: Int64?
        var resumption: Resumption
    }

    /// Where the thread is.
    enum Place: Equatable {
        /// Not started yet: the first wait or wake starts it.
        case notStarted
        /// Awake: it looks at every wait under the lock before it sleeps again, so nobody needs
        /// to wake it.
        case running
        /// Asleep on its private word (nothing to watch), at most until ``sleepingUntil``.
        case privateWord
        /// Asleep on the source's shared word, at most until ``sleepingUntil``.
        case sharedWord
        /// Stopped (``shutdown()``); waits are refused.
        case exited
    }

    /// What the caller of ``add(seen:deadline:resumption:)``, ``wake(start:)`` or ``shutdown()``
    /// must do once the lock is released.
    enum Wake {
        case none
        /// Spawn the thread.
        case start
        /// Bump the private word and wake it.
        case privateWord
        /// Bump the shared word (by a step that is not a ring) and wake it.
        case sharedWord(Target)
    }

    enum Admission {
        case registered(wake: Wake)
        /// The thread has stopped: end the wait at once (as cancelled).
        case refused
    }

    /// How a wait ended in a round.
    enum Ending: Equatable {
        /// The shared word moved past what it saw.
        case ready
        /// Its deadline passed.
        case expired
        /// The thread stopped.
        case abandoned
    }

    /// What one round of the thread ends, and where it sleeps next.
    struct Round {
        /// The waits that ended (one array: a round that ends nothing allocates nothing).
        var ended: [(resumption: Resumption, ending: Ending)] = []
        /// How many of the ended waits watched the shared word (the source uncounts them).
        var endedWatches = 0
        var sleep: Sleep = .exit

        var ready: [Resumption] { ended.filter { $0.ending == .ready }.map(\.resumption) }
        var expired: [Resumption] { ended.filter { $0.ending == .expired }.map(\.resumption) }
        var abandoned: [Resumption] { ended.filter { $0.ending == .abandoned }.map(\.resumption) }
    }

    enum Sleep: Equatable {
        /// On the private word, until the time (`nil`: until woken).
        case privateWord(until: Int64?)
        /// On the source's shared word, until the time (`nil`: until woken or rung).
        case sharedWord(until: Int64?)
        /// Stop the thread.
        case exit
    }

    let watching: Watching
    private(set) var place = Place.notStarted
    /// When the sleeping thread wakes by itself (`nil`: never). A new deadline wakes it only
    /// when earlier, so re-arming a later deadline in a loop costs no system call.
    private(set) var sleepingUntil: Int64?
    private(set) var waiters: [UInt64: Waiter] = [:]
    /// Waits that watch the shared word (have a `seen`).
    private(set) var watchers = 0
    private var target: Target?
    private var lingerUntil: Int64?
    private var stopping = false

    init(watching: Watching) { self.watching = watching }

    /// Registers wait `id` (unique), which ends when the shared word's generation differs from
    /// `seen` (if given), at `deadline` (if given), or when removed (``remove(_:)``). A deadline
    /// that has passed already is ended by the thread, never by the caller: callbacks always run
    /// there.
    mutating func add(id: UInt64, seen: UInt32?, deadline: Int64?, resumption: Resumption) -> Admission {
        if stopping || place == .exited { return .refused }
        waiters[id] = Waiter(seen: seen, deadline: deadline, resumption: resumption)
        if seen != nil { watchers += 1 }
        let earlier = deadline.map { deadline in sleepingUntil.map { deadline < $0 } ?? true } ?? false
        switch place {
        case .notStarted:
            place = .running
            return .registered(wake: .start)
        case .running, .exited:
            return .registered(wake: .none)
        case .privateWord:
            // Asleep on its own word: a watcher needs it on the shared one.
            guard seen != nil || earlier else { return .registered(wake: .none) }
            place = .running
            return .registered(wake: .privateWord)
        case .sharedWord:
            // Already watching: only an earlier deadline needs it awake.
            guard earlier, let target else { return .registered(wake: .none) }
            place = .running
            return .registered(wake: .sharedWord(target))
        }
    }

    /// Removes a wait that has not ended (cancellation); `nil` when it already ended.
    mutating func remove(_ id: UInt64) -> (resumption: Resumption, watched: Bool)? {
        guard let waiter = waiters.removeValue(forKey: id) else { return nil }
        if waiter.seen != nil { watchers -= 1 }
        return (waiter.resumption, waiter.seen != nil)
    }

    /// Makes the thread go round once more (the source's state changed), starting it if
    /// `start` and it has not started.
    mutating func wake(start: Bool) -> Wake {
        switch place {
        case .notStarted:
            guard start else { return .none }
            place = .running
            return .start
        case .running, .exited:
            return .none
        case .privateWord:
            place = .running
            return .privateWord
        case .sharedWord:
            guard let target else { return .none }
            place = .running
            return .sharedWord(target)
        }
    }

    /// Asks the thread to stop after its current round; the waits still registered then are
    /// abandoned (resumed as cancelled).
    mutating func shutdown() -> Wake {
        stopping = true
        if place == .notStarted {
            place = .exited
            return .none
        }
        return wake(start: false)
    }

    /// One round of the thread, after the source said where it would sleep (`watch`: the
    /// shared word's target and generation; `nil` when there is nothing to watch): ends the
    /// waits that are ready or past their deadline, and publishes where and until when the
    /// thread sleeps. `clock` is read at most once, and only when a deadline or a linger needs it.
    mutating func round(watch: (target: Target, generation: UInt32)?, clock: () -> Int64) -> Round {
        var round = Round()
        var nearest: Int64?
        var ended: [UInt64] = []
        var read: Int64?
        func now() -> Int64 {
            if let read { return read }
            let value = clock()
            read = value
            return value
        }
        // Ended in the order of their deadlines (then of their ids): several that fell due while
        // the thread was kept off the CPU still end, and callbacks fire, in deadline order.
        var ending: [(deadline: Int64, id: UInt64, resumption: Resumption, how: Ending)] = []
        for (id, waiter) in waiters {
            if let seen = waiter.seen, let watch, seen != watch.generation {
                ending.append((waiter.deadline ?? .max, id, waiter.resumption, .ready))
            } else if let deadline = waiter.deadline, deadline <= now() {
                ending.append((deadline, id, waiter.resumption, .expired))
            } else {
                if let deadline = waiter.deadline { nearest = nearest.map { min($0, deadline) } ?? deadline }
                continue
            }
            ended.append(id)
            if waiter.seen != nil { round.endedWatches += 1 }
        }
        if ending.count > 1 { ending.sort { ($0.deadline, $0.id) < ($1.deadline, $1.id) } }
        for entry in ending { round.ended.append((entry.resumption, entry.how)) }
        for id in ended { waiters.removeValue(forKey: id) }
        watchers -= round.endedWatches
        target = nil
        if stopping {
            for waiter in waiters.values { round.ended.append((waiter.resumption, .abandoned)) }
            round.endedWatches += watchers
            waiters.removeAll()
            watchers = 0
            place = .exited
            round.sleep = .exit
            return round
        }
        var shared = false
        if watch != nil {
            switch watching {
            case .always:
                shared = true
            case .whileWaited(let linger):
                if watchers > 0 {
                    lingerUntil = nil
                    shared = true
                } else {
                    let until = lingerUntil ?? now() &+ linger
                    if until > now() {
                        lingerUntil = until
                        nearest = nearest.map { min($0, until) } ?? until
                        shared = true
                    } else {
                        lingerUntil = nil
                    }
                }
            }
        }
        // With nothing to watch while watchers wait (a source that offers no word), the thread
        // sleeps on its private word: the watchers then end at their deadline, by cancellation,
        // or once a ``wake(start:)`` brings a word to watch. Never a busy loop.
        sleepingUntil = nearest
        if shared, let watch {
            target = watch.target
            place = .sharedWord
            round.sleep = .sharedWord(until: nearest)
        } else {
            place = .privateWord
            round.sleep = .privateWord(until: nearest)
        }
        return round
    }

    /// The thread woke (or decided not to sleep): it is running until its next round.
    mutating func woke() {
        if place != .exited { place = .running }
        target = nil
    }
}
