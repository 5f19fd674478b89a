import Synchronization

/// Keeps one connection to your server up, and only while the process may hold it.
///
/// Give it a `connect()` closure and run it as a service (``run()``, cancelled to stop):
///
/// ```swift
/// let supervisor = ConnectionSupervisor(container: container, permit: rolePermit,
///                                       reachability: try NetlinkReachability()) {
///     try await MyServerConnection.open(host: "example.org")
/// }
/// try await withThrowingDiscardingTaskGroup { group in
///     group.addTask { try await supervisor.run() }
///     for await state in supervisor.states() { print(state) }
/// }
/// ```
///
/// - It reconnects at once when a connection drops, then backs off exponentially with full
///   jitter (``ConnectionBackoff``), capped and reset after a stable period.
/// - It tries again at once when the ``Reachability`` monitor reports a reachable path during a
///   back-off, and pings the live connection at once on any network change.
/// - It pings the connection every ``Configuration/keepAliveInterval``.
/// - It connects only while it holds a ``ConnectionGrant`` from its ``ConnectionPermit`` (the
///   role). When the grant must end (a stop request, the container's suspension), it first waits
///   for critical sections (``withCriticalSection(_:)``, ``SensitiveTasks``), then closes the
///   connection, and only then releases the grant: two processes are never connected at once.
///   On suspension it closes the connection before any lock of the container is released.
///
/// There are no hidden tasks: everything runs inside ``run()``.
public final class ConnectionSupervisor<Connection: SupervisedConnection>: CriticalSectionProvider {
    /// Tuning.
    public struct Configuration: Sendable {
        /// The back-off between attempts.
        public var backoff: ConnectionBackoff
        /// How often to ping a live connection; `nil` for never.
        public var keepAliveInterval: Duration?
        /// How long one `connect()` may take before it is cancelled and counted as a failure.
        public var connectTimeout: Duration

        /// Creates a configuration.
        /// - Parameters:
        ///   - backoff: The back-off policy.
        ///   - keepAliveInterval: Ping interval (default 60 s); `nil` disables pings.
        ///   - connectTimeout: The limit of one connection attempt (default 30 s).
        public init(
            backoff: ConnectionBackoff = ConnectionBackoff(),
            keepAliveInterval: Duration? = .seconds(60),
            connectTimeout: Duration = .seconds(30)
        ) {
            self.backoff = backoff
            self.keepAliveInterval = keepAliveInterval
            self.connectTimeout = connectTimeout
        }
    }

    private struct State {
        var running = false
        var connection: Connection?
        var grant: (any ConnectionGrant)?
        /// Attempts since the last stable connection (0: the next one is made at once).
        var attempt = 0
        var criticalSections = 0
        var network: NetworkPath?
        var sessionActive = false
        var stopSession = false
        /// A connect attempt has started and its connection is not yet in `connection`.
        var attemptInFlight = false
        /// The session is ending on a stop request: no attempt may start.
        var ending = false
        var lastError: (any Error & Sendable)?
        var connections = 0
    }

    /// The tuning it was created with.
    public let configuration: Configuration
    private let connectBody: @Sendable () async throws -> Connection
    private let permit: any ConnectionPermit
    private let reachability: (any Reachability)?
    private let container: SharedContainer?
    private let state = Mutex(State())
    private let broadcast = Broadcast<ConnectionState>(initial: .stopped)
    /// Moves on every reachability update.
    private let networkEvents = EventCounter()
    /// Moves when a critical section ends, a session must stop, or a session ended.
    private let sessionEvents = EventCounter()

    /// Creates a supervisor; nothing happens until ``run()``.
    /// - Parameters:
    ///   - container: The shared container whose suspension closes the connection first; `nil`
    ///     when the process does not use Baton's suspension.
    ///   - permit: Who allows connecting: the role (see ``ConnectionPermit``), or
    ///     ``UnrestrictedPermit`` (the default).
    ///   - reachability: A network monitor, or `nil`.
    ///   - configuration: Back-off, keep-alive and timeout settings.
    ///   - connect: Opens a connection; it should honour task cancellation.
    public init(
        container: SharedContainer? = nil,
        permit: any ConnectionPermit = UnrestrictedPermit(),
        reachability: (any Reachability)? = nil,
        configuration: Configuration = Configuration(),
        connect: @escaping @Sendable () async throws -> Connection
    ) {
        self.container = container
        self.permit = permit
        self.reachability = reachability
        self.configuration = configuration
        self.connectBody = connect
    }

    // MARK: Observing

    /// The current state.
    public var currentState: ConnectionState { broadcast.latest ?? .stopped }

    /// The live connection, if any.
    public var connection: Connection? { state.withLock { $0.connection } }

    /// The last error `connect()` threw (or a connect timeout), for diagnostics.
    public var lastError: (any Error & Sendable)? { state.withLock { $0.lastError } }

    /// How many connections were established since creation.
    public var connectionCount: Int { state.withLock { $0.connections } }

    /// The current state, then every transition, in order. Stop iterating to unsubscribe.
    public func states() -> AsyncStream<ConnectionState> { broadcast.subscribe() }

    // MARK: Critical sections

    /// Runs `body` while holding off stop requests: the connection stays up (and the role held)
    /// until `body` returns. Inside a grant, the grant's own critical section is used (for a
    /// role, its status then says so).
    /// - Parameter body: The work.
    /// - Returns: What `body` returns.
    /// - Throws: What `body` or the grant's critical section throws.
    public func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R {
        let grant = state.withLock { state -> (any ConnectionGrant)? in
            state.criticalSections += 1
            return state.grant
        }
        defer {
            state.withLock { $0.criticalSections -= 1 }
            sessionEvents.notify()
        }
        if let grant { return try await grant.withCriticalSection(body) }
        return try await body()
    }

    // MARK: Running

    /// Keeps the connection up until the task is cancelled, then closes it, releases the
    /// grant, publishes ``ConnectionState/stopped`` and returns.
    /// - Throws: `invalidArgument` if it is already running; an error of the permit other than
    ///   `suspended` (which makes it wait for the container to resume) or cancellation.
    public func run() async throws {
        let alreadyRunning = state.withLock { state -> Bool in
            defer { state.running = true }
            return state.running
        }
        if alreadyRunning {
            throw BatonError(.invalidArgument, "this ConnectionSupervisor is already running; run it from one task only")
        }
        defer {
            state.withLock { $0.running = false }
            broadcast.yield(.stopped)
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            if let reachability {
                group.addTask {
                    for await path in reachability.updates() { self.noteNetwork(path) }
                }
            }
            defer { group.cancelAll() }
            try await superviseUntilCancelled()
        }
    }

    private func publish(_ newState: ConnectionState) {
        broadcast.yield(newState)
    }

    private func noteNetwork(_ path: NetworkPath) {
        state.withLock { $0.network = path }
        networkEvents.notify()
    }

    private func superviseUntilCancelled() async throws {
        while !Task.isCancelled {
            publish(.waitingForPermit)
            if let container, container.suspension.isSuspended {
                do { try await waitUntilActive(container) } catch { return }
                continue
            }
            let grant: any ConnectionGrant
            do {
                handOverTrace("sup.acquire")
                grant = try await permit.acquire(deadline: .never)
            } catch is CancellationError {
                return
            } catch let error as BatonError where error.code == .cancelled {
                return
            } catch let error as BatonError where error.code == .suspended {
                continue
            }
            if Task.isCancelled || container?.suspension.isSuspended == true {
                await grant.release()
                continue
            }
            await session(grant)
            // Unless the stop request's watcher released it already (``releaseOnStop(_:)``).
            if state.withLock({ $0.grant != nil }) { await grant.release() }
            state.withLock { state in
                state.grant = nil
                state.sessionActive = false
                state.connection = nil
            }
            sessionEvents.notify()
        }
    }

    private func waitUntilActive(_ container: SharedContainer) async throws {
        while true {
            let seen = container.suspension.transitions.snapshot()
            if !container.suspension.isSuspended { return }
            try await container.suspension.transitions.wait(after: seen, deadline: .never)
        }
    }

    /// One grant: connect and reconnect until the grant must end, then close.
    private func session(_ grant: any ConnectionGrant) async {
        handOverTrace("sup.session")
        state.withLock { state in
            state.grant = grant
            state.sessionActive = true
            state.stopSession = false
            state.attempt = 0
            state.attemptInFlight = false
            state.ending = false
        }
        // Registered after the grant (a role lease registers itself when acquired), so the
        // container suspends this first: the connection is closed before the role's locks go.
        let token = container?.suspension.register(SessionSuspension(self))
        defer { if let token, let container { container.suspension.unregister(token) } }
        // One group, no nesting: the first child to return ends the session. A stop request's
        // child releases the grant itself when it can (``releaseOnStop(_:)``), so the process
        // that asked does not wait for the other children to wind down. The connect loop starts
        // immediately, on this thread, until it first suspends: the first connect follows the
        // grant without a hand-off to another thread (about 20 µs of a hand-over on a two-core
        // machine), and does not wait behind the watchers' first looks. The watchers start
        // after it; each looks at the state before it waits (a stop request written meanwhile
        // is in the role's record, a suspension in `stopSession`).
        await withTaskGroup(of: Void.self) { group in
            if #available(macOS 26, iOS 26, watchOS 26, tvOS 26, visionOS 26, *) {
                group.addImmediateTask { await self.connectLoop() }
            } else {
                group.addTask { await self.connectLoop() }
            }
            // On the thread that receives the stop request (a role's: the signal thread), which
            // then closes and releases without handing over to a thread of the global executor
            // (a pool thread's wake-up: 15-30 µs of a hand-over on a two-core machine); `nil`
            // is no preference.
            group.addTask(executorPreference: grant.stopRequestExecutor) { await self.untilStopRequested(grant) }
            group.addTask { try? await self.untilSuspensionStop() }
            await group.next()
            group.cancelAll()
        }
    }

    /// Returns when the grant asks to stop (or ended) and critical sections are over, after
    /// closing the connection and releasing the grant if no attempt is in flight; or when the
    /// container suspends meanwhile (which does not wait for critical sections: the system is
    /// taking the process's time away regardless); or when cancelled.
    private func untilStopRequested(_ grant: any ConnectionGrant) async {
        do { try await grant.stopRequested() } catch { return }
        handOverTrace("sup.stopreq")
        while !Task.isCancelled {
            let seen = sessionEvents.snapshot()
            let (sectionsEnded, suspending) = state.withLock { ($0.criticalSections == 0, $0.stopSession) }
            if suspending { return }
            if sectionsEnded {
                await releaseOnStop(grant)
                return
            }
            do { try await sessionEvents.wait(after: seen, deadline: .never) } catch { return }
        }
    }

    /// On a stop request: closes the live connection and releases the grant here and now,
    /// unless a connect attempt is in flight (the session's end then cancels it and waits for
    /// it, and the grant is released after). No attempt starts after this looked: the session
    /// is marked as ending in the same locked step. The requester's wait thus ends one close
    /// and one release after the request was seen, not after every task of the session ended.
    private func releaseOnStop(_ grant: any ConnectionGrant) async {
        let taken = state.withLock { state -> Connection?? in
            guard !state.attemptInFlight else { return nil }
            state.ending = true
            defer { state.connection = nil }
            return .some(state.connection)
        }
        guard case .some(let connection) = taken else { return }
        handOverTrace("sup.close")
        if let connection { await connection.close() }
        handOverTrace("sup.release")
        await grant.release()
        handOverTrace("sup.released")
        state.withLock { $0.grant = nil }
    }

    private func untilSuspensionStop() async throws {
        while true {
            let seen = sessionEvents.snapshot()
            if state.withLock({ $0.stopSession }) { return }
            try await sessionEvents.wait(after: seen, deadline: .never)
        }
    }

    /// Called by the container's suspension: ends the session and waits until the connection
    /// is closed and the grant released.
    fileprivate func suspendSession() async {
        state.withLock { $0.stopSession = true }
        sessionEvents.notify()
        while true {
            let seen = sessionEvents.snapshot()
            if !state.withLock({ $0.sessionActive }) { return }
            do { try await sessionEvents.wait(after: seen, deadline: .never) } catch { return }
        }
    }

    private func connectLoop() async {
        while !Task.isCancelled {
            let next = state.withLock { state -> Int? in
                guard !state.ending else { return nil }
                defer { state.attempt += 1 }
                return state.attempt
            }
            guard let attempt = next else { return }
            if attempt > 0 {
                let until = ContinuousClock.now.advanced(by: configuration.backoff.delay(forAttempt: attempt))
                publish(.waiting(until: until, attempt: attempt))
                do { try await waitForRetry(until: until) } catch { return }
            }
            // Marked in flight in the same locked step that checks the session is not ending,
            // and stored (or dropped) in one step with clearing the mark: a stop request's early
            // release never happens while an attempt may still connect.
            let starts = state.withLock { state -> Bool in
                guard !state.ending else { return false }
                state.attemptInFlight = true
                return true
            }
            guard starts else { return }
            handOverTrace("sup.connect")
            let connection = await connectOnce { self.publish(.connecting(attempt: attempt)) }
            handOverTrace("sup.connected")
            let since = ContinuousClock.now
            let kept = state.withLock { state -> Bool in
                state.attemptInFlight = false
                guard let connection, !Task.isCancelled, !state.ending else { return false }
                state.connection = connection
                state.connections += 1
                return true
            }
            guard let connection else { continue }
            guard kept else {
                await connection.close()
                return
            }
            publish(.connected(since: since))
            await keepUp(connection, watchingOn: state.withLock { $0.grant?.stopRequestExecutor })
            let stable = ContinuousClock.now - since >= configuration.backoff.stablePeriod
            state.withLock { state in
                state.connection = nil
                if stable { state.attempt = 0 }
            }
        }
    }

    /// Waits until `until`, or less if the network is reported reachable meanwhile.
    private func waitForRetry(until: ContinuousClock.Instant) async throws {
        while true {
            let seen = networkEvents.snapshot()
            if ContinuousClock.now >= until { return }
            do {
                try await networkEvents.wait(after: seen, deadline: Deadline(until))
            } catch let error as BatonError where error.code == .timedOut {
                return
            }
            if state.withLock({ $0.network?.status == .reachable }) { return }
        }
    }

    /// What the deadline timer of one attempt and the attempt share.
    private final class AttemptTimeout: Sendable {
        /// Set by the timer when the attempt ran out of time (before it cancels it).
        let fired = Atomic<Bool>(false)
        /// Set by the attempt when `connect` returned or threw.
        let finished = Atomic<Bool>(false)
        /// The attempt, stored before the timer is armed.
        let attempt = Mutex<Task<Connection, any Error>?>(nil)
    }

    /// Starts one connect attempt as an unstructured task.
    ///
    /// On the global executor it starts immediately (`Task.immediate`): `connect` runs on this
    /// thread until it first suspends, and one that completes without suspending (a blocking
    /// `connect(2)`, as most are on loopback or a LAN) costs no hand-off to another thread,
    /// neither to start it nor to take its result, about 90 µs of the hand-over on a
    /// two-core machine. Under a task executor preference (the signal thread), it is an ordinary
    /// task on the global executor, so that `connect` never occupies that thread. Before
    /// `Task.immediate` exists (before macOS 26 and iOS 26), always an ordinary task.
    private static func startAttempt(_ connect: @escaping @Sendable () async throws -> Connection) -> Task<Connection, any Error> {
        let preferred = withUnsafeCurrentTask { $0?.unownedTaskExecutor != nil }
        if !preferred, #available(macOS 26, iOS 26, watchOS 26, tvOS 26, visionOS 26, *) {
            return Task.immediate { try await connect() }
        }
        return Task { try await connect() }
    }

    /// One attempt, bounded by the connect timeout. `nil` when it failed or was cancelled.
    ///
    /// The attempt runs in one task; the process's deadline timer cancels it at the timeout.
    /// (A second, sleeping task raced against it in a task group cost two more thread wake-ups
    /// per connect: the sleeper's start, and its cancellation that the group waits for.) See
    /// ``startAttempt(_:)`` for where it runs.
    ///
    /// The timer is armed only for an attempt still running once started, with the timeout
    /// counted from before the start: an attempt started immediately that finished without
    /// suspending needs none, and arming it would wake the timer's thread (a timer thread with
    /// nothing to do sleeps without a deadline) on the way to the connection, about 10 µs of a
    /// hand-over here. An attempt that ran past its timeout before it first suspended is
    /// cancelled as soon as the timer is armed (its deadline has passed).
    ///
    /// `started` runs once the attempt has started, before its result is awaited: it publishes
    /// ``ConnectionState/connecting(attempt:)``, which wakes the subscribers' tasks. After the
    /// start, not before it: an attempt that starts immediately and completes without
    /// suspending then has its connection up before this process spends a thread's wake-up on
    /// telling its subscribers (about 10-20 µs of a hand-over on a two-core machine); they
    /// still see `connecting` before `connected`.
    private func connectOnce(started: () -> Void) async -> Connection? {
        let timeout = configuration.connectTimeout
        let connect = connectBody
        let expiry = AttemptTimeout()
        let deadline = ContinuousClock.now.advanced(by: timeout)
        let attempt = Self.startAttempt {
            defer { expiry.finished.store(true, ordering: .releasing) }
            return try await connect()
        }
        started()
        expiry.attempt.withLock { $0 = attempt }
        let timer: UInt64? = expiry.finished.load(ordering: .acquiring) ? nil : DeadlineTimer.shared.schedule(at: deadline) {
            expiry.fired.store(true, ordering: .releasing)
            expiry.attempt.withLock { $0 }?.cancel()
        }
        let result = await withTaskCancellationHandler {
            await attempt.result
        } onCancel: {
            attempt.cancel()
        }
        if let timer { DeadlineTimer.shared.cancel(timer) }
        let timedOut = expiry.fired.load(ordering: .acquiring)
        switch result {
        case .success(let connection) where !timedOut:
            return connection
        case .success(let connection):
            // Completed after the timeout cancelled it: not used.
            await connection.close()
        case .failure(let error):
            if !timedOut && !(error is CancellationError) { state.withLock { $0.lastError = error } }
        }
        if timedOut {
            state.withLock {
                $0.lastError = BatonError(.timedOut, "connect() did not finish within \(timeout); check the server address, or raise Configuration.connectTimeout")
            }
        }
        return nil
    }

    /// Watches a live connection until it closes, a ping fails, or the task is cancelled;
    /// then closes it.
    ///
    /// `closed()` is awaited on `executor`, the grant's ``ConnectionGrant/stopRequestExecutor``
    /// (a role's: the signal thread), where a stop request closes the connection: the close
    /// then resumes that wait on its own thread, where the job waits until the close and the
    /// release are done, instead of waking a thread of the global executor first (about 20 µs
    /// of a hand-over, before the release, on a two-core machine whose idle processors halt).
    private func keepUp(_ connection: Connection, watchingOn executor: (any TaskExecutor)?) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask(executorPreference: executor) { await connection.closed() }
            if let interval = configuration.keepAliveInterval {
                group.addTask { await self.keepAlive(connection, every: interval) }
            }
            group.addTask { try? await EventCounter().wait(after: 0, deadline: .never) } // ends on cancellation
            await group.next()
            group.cancelAll()
            await connection.close()
        }
    }

    /// Pings on the interval and at once on a network change; returns when a ping fails or
    /// the task is cancelled.
    private func keepAlive(_ connection: Connection, every interval: Duration) async {
        var next = ContinuousClock.now.advanced(by: interval)
        while true {
            let seen = networkEvents.snapshot()
            do {
                try await networkEvents.wait(after: seen, deadline: Deadline(next))
            } catch let error as BatonError where error.code == .timedOut {
                // The interval elapsed.
            } catch {
                return
            }
            do { try await connection.ping() } catch { return }
            next = ContinuousClock.now.advanced(by: interval)
        }
    }

    private final class SessionSuspension: SuspensionParticipant {
        let supervisor: ConnectionSupervisor<Connection>
        init(_ supervisor: ConnectionSupervisor<Connection>) { self.supervisor = supervisor }
        func suspend() async { await supervisor.suspendSession() }
        func resume() async throws {}
    }
}

extension ConnectionSupervisor: Sendable {}
