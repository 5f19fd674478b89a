import CBatonShims
import Synchronization

/// Named, payload-free, coalescing notifications between the processes of a container, with the
/// semantics of Darwin's notify(3):
///
/// - a signal carries no data, only an optional 64-bit state per name that anyone can read;
/// - posts may coalesce: ten quick posts can arrive as one delivery;
/// - every post made after an observation started is followed by at least one delivery to it.
///
/// ```swift
/// let signals = try container.signals
/// let changes = try signals.observe("messages")      // observing starts here
/// try signals.post("messages", state: 42)            // in any process
/// for await delivery in changes { print(delivery.state) }
/// ```
///
/// Signals are doorbells: keep the data in files or the database, and re-read it on delivery.
///
/// The names live in a shared-memory table in the container (`.baton/signals`), on every
/// platform, woken through the kernel's wait-on-address primitive (futex on Linux,
/// `os_sync_wait_on_address` on Apple platforms); a process uses one thread for all the names it
/// observes. The code that runs on iOS is the code the Linux tests run: notify(3) is not used.
public final class Signals: Sendable {
    /// The longest name, in bytes of UTF-8.
    public static let maxNameBytes = 128

    let backend: any SignalBackend

    init(container: SharedContainer) throws {
        let table = try SignalTable(container: container)
        // The table's process entry is owned through the owner token: released while suspended.
        _ = container.suspension.register(SignalSuspension(table))
        if container.suspension.isSuspended { table.releaseLocks() }
        backend = table
    }

    /// An executor that runs tasks on this process's signal thread, the thread that wakes when a
    /// signal is posted. A task that iterates an observation inside
    /// `withTaskExecutorPreference(signals.executor) { ... }` is resumed by that thread directly,
    /// without waking a second thread: the lowest post-to-wake latency Baton offers. Keep such
    /// work short and never block in it: it delays every delivery in the process.
    public var executor: any TaskExecutor { backend.executor }

    /// Rings `name` without changing its state.
    /// - Throws: `invalidName`, `capacityExceeded` when the table of names is full.
    public func post(_ name: String) throws {
        try Self.validate(name)
        try backend.post(name, state: nil)
    }

    /// Sets the state of `name`, then rings it.
    public func post(_ name: String, state: UInt64) throws {
        try Self.validate(name)
        try backend.post(name, state: state)
    }

    /// The last state posted for `name` (0 if none).
    public func state(of name: String) throws -> UInt64 {
        try Self.validate(name)
        return try backend.state(of: name)
    }

    /// Starts observing `name`. Every post made after this returns is followed by at least one
    /// delivery on the returned sequence (possibly coalesced with other posts).
    public func observe(_ name: String) throws -> SignalObservation {
        try Self.validate(name)
        let observer = SignalObserver(name: name)
        let registration = try backend.register(observer)
        observer.setRegistration(registration)
        return SignalObservation(observer: observer)
    }

    /// Waits for the next delivery on `name` that follows this call.
    /// - Throws: `timedOut` at the deadline, `CancellationError` when cancelled.
    public func wait(for name: String, deadline: Deadline) async throws -> SignalDelivery {
        let observation = try observe(name)
        return try await observation.next(deadline: deadline)
    }

    /// Checks a signal name: 1...128 bytes of UTF-8, no NUL.
    package static func validate(_ name: String) throws {
        let count = name.utf8.count
        guard count >= 1, count <= maxNameBytes else {
            throw BatonError(.invalidName, "a signal name must be 1 to \(maxNameBytes) bytes of UTF-8; this one is \(count) bytes")
        }
        // (Over the contiguous bytes when the string has them: posting validates every time.)
        let hasNUL = name.utf8.withContiguousStorageIfAvailable { $0.contains(0) } ?? name.utf8.contains(0)
        guard !hasNUL else {
            throw BatonError(.invalidName, "a signal name may not contain NUL")
        }
    }
}

/// One delivery of a signal.
public struct SignalDelivery: Sendable, Hashable {
    /// The signal's name.
    public var name: String
    /// Its state when the delivery was made.
    public var state: UInt64

    public init(name: String, state: UInt64) {
        self.name = name
        self.state = state
    }
}

/// The deliveries of one signal name to one observer, as an `AsyncSequence`.
///
/// Observation starts when the sequence is created (``Signals/observe(_:)``) and ends when the
/// sequence and its iterators are gone or ``cancel()`` is called. Iterate it from one task.
public struct SignalObservation: AsyncSequence, Sendable {
    public typealias Element = SignalDelivery
    let observer: SignalObserver

    /// Stops observing; a pending `next()` returns `nil`.
    public func cancel() { observer.finish() }

    /// The next delivery.
    ///
    /// Runs on the caller's executor (`nonisolated(nonsending)`): it only takes a lock before it
    /// suspends, so a caller on an actor stays there, and a task that prefers
    /// ``Signals/executor`` makes no executor hop (each hop of such a task looks its preference
    /// up in the runtime, under a lock).
    /// - Throws: `timedOut` at the deadline; `CancellationError` when the task is cancelled.
    nonisolated(nonsending) public func next(deadline: Deadline) async throws -> SignalDelivery {
        try await observer.next(deadline: deadline)
    }

    /// The next delivery of any of `observations` (several names at once, one continuation
    /// for all), or throws `timedOut` at the deadline.
    /// - Parameters:
    ///   - observations: Observations iterated by this task only.
    ///   - deadline: When to give up.
    /// - Returns: A delivery of one of them; the others keep theirs for later.
    /// - Throws: `timedOut`; `CancellationError` when the task is cancelled or an observation
    ///   was cancelled.
    ///
    /// Runs on the caller's executor, as ``next(deadline:)`` does.
    nonisolated(nonsending) public static func next(from observations: [SignalObservation], deadline: Deadline) async throws -> SignalDelivery {
        while true {
            let seen = observations.map { ($0.observer.arrivalCounter, $0.observer.arrivalCounter.snapshot()) }
            for observation in observations {
                if let delivery = try observation.observer.take() { return delivery }
            }
            _ = try await EventCounter.waitAny(seen.map { (counter: $0.0, seen: $0.1) }, deadline: deadline)
        }
    }

    public func makeAsyncIterator() -> Iterator { Iterator(observer: observer) }

    /// Iterates deliveries.
    public struct Iterator: AsyncIteratorProtocol {
        let observer: SignalObserver
        /// The next delivery, or `nil` once the observation or the task is cancelled. Runs on
        /// the caller's executor, as ``SignalObservation/next(deadline:)`` does.
        nonisolated(nonsending) public mutating func next() async -> SignalDelivery? {
            try? await observer.next(deadline: .never)
        }
    }
}

/// An observer's mailbox: the backend's thread deposits deliveries, coalescing them; one task
/// takes them.
final class SignalObserver: Sendable {
    let name: String
    private struct State {
        var pending: SignalDelivery?
        /// How many posts the pending delivery stands for (at least).
        var pendingPosts: UInt64 = 0
        var finished = false
        var registration: (any SignalRegistration)?
    }
    private let state = Mutex(State())
    private let arrivals = EventCounter()

    init(name: String) { self.name = name }

    func setRegistration(_ registration: any SignalRegistration) {
        state.withLock { $0.registration = registration }
    }

    /// Called by the backend (any thread): coalesces with a delivery not taken yet.
    /// - Parameters:
    ///   - value: The signal's state, read after its counter.
    ///   - posts: How many posts the counter moved by since the last delivery; 2 when the
    ///     backend cannot tell (taken as "more than one").
    func deliver(state value: UInt64, posts: UInt64) {
        let accepted = state.withLock { state -> Bool in
            guard !state.finished else { return false }
            state.pending = SignalDelivery(name: name, state: value)
            let (sum, overflow) = state.pendingPosts.addingReportingOverflow(max(posts, 1))
            state.pendingPosts = overflow ? .max : sum
            return true
        }
        if accepted { arrivals.notify() }
    }

    func finish() {
        let registration = state.withLock { state -> (any SignalRegistration)? in
            state.finished = true
            defer { state.registration = nil }
            return state.registration
        }
        registration?.cancel()
        arrivals.notify()
    }

    /// Moves with each delivery and when the observer finishes: for waits on several sources
    /// (snapshot it, then ``take()``, then wait).
    var arrivalCounter: EventCounter { arrivals }

    /// The delivery not taken yet, if any.
    /// - Throws: `CancellationError` once the observation was cancelled.
    func take() throws -> SignalDelivery? {
        try takeCounted()?.delivery
    }

    /// The delivery not taken yet, with how many posts it stands for: a delivery whose state
    /// is one this process posted is that post alone only when it stands for one post (the
    /// state is the last poster's, so a post by another process just before is hidden in it).
    /// - Throws: `CancellationError` once the observation was cancelled.
    func takeCounted() throws -> (delivery: SignalDelivery, posts: UInt64)? {
        let taken = state.withLock { state -> (SignalDelivery?, UInt64, Bool) in
            defer {
                state.pending = nil
                state.pendingPosts = 0
            }
            return (state.pending, state.pendingPosts, state.finished)
        }
        if let delivery = taken.0 { return (delivery, taken.1) }
        if taken.2 { throw CancellationError() }
        return nil
    }

    nonisolated(nonsending) func next(deadline: Deadline) async throws -> SignalDelivery {
        while true {
            let seen = arrivals.snapshot()
            if let delivery = try take() { return delivery }
            try await arrivals.wait(after: seen, deadline: deadline)
        }
    }

    deinit {
        state.withLock { $0.registration }?.cancel()
    }
}

/// A registration with a backend; cancel to stop deliveries.
protocol SignalRegistration: Sendable {
    func cancel()
}

/// A platform's implementation of signals.
protocol SignalBackend: Sendable {
    var executor: any TaskExecutor { get }
    func post(_ name: String, state: UInt64?) throws
    func state(of name: String) throws -> UInt64
    func register(_ observer: SignalObserver) throws -> any SignalRegistration
    /// Drops every kernel lock the backend holds (the container is suspending).
    func releaseLocks()
    /// Takes them back after a suspension.
    func retakeLocks()
}

extension SignalBackend {
    func releaseLocks() {}
    func retakeLocks() {}
}

/// Forwards the container's suspension to the signal backend (held weakly: the container keeps
/// its participants, the signals keep the backend).
final class SignalSuspension: SuspensionParticipant {
    private weak let backend: (any SignalBackend & AnyObject)?
    init(_ backend: any SignalBackend & AnyObject) { self.backend = backend }
    func suspend() async { backend?.releaseLocks() }
    func resume() async throws { backend?.retakeLocks() }
}
