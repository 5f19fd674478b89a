import Baton
import BatonSpawn
import CBatonHarness
import CBatonShims
import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// The loopback fixture's server: a real TCP server on 127.0.0.1 that holds messages for one
/// user the way a chat or payment server does for a phone, and records every connection.
///
/// It speaks the protocol of ``LoopbackLine``. It serves the lifecycle tests and benchmark (it
/// records connections in one global order, drops them on command, refuses new ones), the
/// simulator (messages, pushes when no core is connected, overlaps of two cores) and the inbox's
/// tests, benchmark and sample (the same, driven over the wire by `PUSH`, `STATS`, `DELAY`).
///
/// One ``PollLoop`` thread does all its I/O; it starts with the server and stops when the server
/// is released or ``run()`` is cancelled.
///
/// Users of `BatonSimulator` see only what a simulation needs: `init(timeline:onPush:)` (in
/// `BatonSimulator`), ``port``, ``run()``, ``send(id:payload:)``, ``counts`` and
/// ``overlappingConnections``; the rest serves Baton's own tests and benchmarks.
public final class LoopbackServer: Sendable {
    /// One connection the server saw.
    package struct Record: Sendable, Hashable, Codable {
        package var id: Int
        /// The name, pid and role epoch the client gave in its `HELLO` line, if any.
        package var name: String?
        package var pid: Int32?
        package var epoch: UInt64?
        /// CLOCK_MONOTONIC nanoseconds.
        package var openedAt: UInt64
        /// Position of the open in the server's global order of events.
        package var openedOrder: Int
        package var closedAt: UInt64?
        package var closedOrder: Int?
        /// `client` or `server`.
        package var closedBy: String?
        package var pings: Int = 0

        package var isOpen: Bool { closedAt == nil }
        /// Whether the client said `HELLO`.
        package var isCore: Bool { pid != nil }
    }

    /// What happened, for a timeline.
    package enum Event: Sendable {
        case received(id: String)
        case pushed(id: String, again: Bool)
        case delivered(id: String, pid: Int32)
        case acknowledged(id: String)
        case coreConnected(pid: Int32, epoch: UInt64)
        case coreDisconnected(pid: Int32)
        case overlap(pid: Int32, epoch: UInt64, others: [Int32])
    }

    private struct Message {
        var id: String
        var payload: [UInt8]
        var sent: UInt64
        var deliveredTo: Int32?
    }

    private struct State {
        var listener: Int32 = -1
        var records: [Record] = []
        var openByFD: [Int32: Int] = [:]
        var splitters: [Int32: LineSplitter] = [:]
        var order = 0
        var messages: [Message] = []
        /// The newest core's descriptor, when it may be sent something at `nextSend`.
        var nextSend: UInt64 = 0
        var owesIdle = false
        var delay: UInt64 = 0
        /// Overlap checks due: (record, deadline, the other cores open at its `HELLO`).
        var overlapChecks: [(record: Int, due: UInt64, others: [Int])] = []
        var cores = 0, fetches = 0, pushes = 0, acked = 0, overlaps = 0
        var stopped = false
    }

    /// How long an older core's connection may stay open after a newer core's `HELLO`: the
    /// kernel closes a killed process's socket while tearing the process down.
    private static let overlapGrace: UInt64 = 150_000_000

    /// The port it listens on.
    public let port: UInt16
    /// Whether it speaks first: an `IDLE` line to the newest core after each `HELLO` and close,
    /// and overlap checks on its timer. Without, it only answers and records, and its thread
    /// wakes for its sockets alone.
    private let messaging: Bool
    private let state = Mutex(State())
    /// Word 0: bumped at every change of the records (``noteChange()``); word 1: how many threads sleep on word 0
    /// (``waitForOpenConnections(timeout:until:)``), so that the server's thread makes no wake-up
    /// call while nobody waits. (Only touched atomically; `nonisolated(unsafe)` because a
    /// pointer is not `Sendable`.)
    nonisolated(unsafe) private let changes: UnsafeMutablePointer<UInt32>
    /// Moves with every change of the records (the count of `changes` in the same step), for
    /// ``waitUntil(timeout:_:)``, which waits suspended instead of holding a thread.
    private let recordChanges = EventCounter()
    private let onEvent: @Sendable (Event) -> Void
    private let onPush: @Sendable (String) -> Void
    private let loop: Mutex<PollLoop?> = Mutex(nil)

    /// Starts listening on 127.0.0.1.
    /// - Parameters:
    ///   - port: The port (0: an ephemeral one).
    ///   - delayMilliseconds: Waited before each delivery to a core.
    ///   - messaging: Whether it speaks first (`IDLE` lines, overlap checks): `false` makes a
    ///     server that only answers and records connections (the lifecycle benchmark's: no
    ///     `IDLE` line wakes a third process's client thread, and no wake-up of its own thread
    ///     follows a `HELLO` or a close, while a hand-over is measured).
    ///   - preemptsOnWake: `false` makes the server's thread `SCHED_BATCH` on Linux (nothing
    ///     elsewhere). A real server runs on another machine and takes no processor from the
    ///     device's threads; this one shares them, but its wake-ups (a connection accepted, read
    ///     or closed) then do not preempt a running thread: they wait for a free processor or
    ///     the next tick. The lifecycle benchmark's server
    ///     (``PollLoop/init(name:backend:preemptsOnWake:tick:)``).
    ///   - onEvent: Called on the server's thread with each event.
    ///   - onPush: Called on the server's thread with a message id when no core is connected to
    ///     take it (a push notification must be sent).
    /// - Throws: `systemCallFailed` when the port cannot be bound.
    package init(
        port: UInt16 = 0,
        delayMilliseconds: Int = 0,
        messaging: Bool = true,
        preemptsOnWake: Bool = true,
        onEvent: @escaping @Sendable (Event) -> Void = { _ in },
        onPush: @escaping @Sendable (String) -> Void = { _ in }
    ) throws {
        let (listener, bound) = try LoopbackSocket.listening(port: port)
        self.port = bound
        self.messaging = messaging
        changes = .allocate(capacity: 2)
        changes.initialize(repeating: 0, count: 2)
        self.onEvent = onEvent
        self.onPush = onPush
        state.withLock {
            $0.listener = listener
            $0.delay = UInt64(max(0, delayMilliseconds)) * 1_000_000
        }
        let created = try PollLoop(name: "loopback-server", preemptsOnWake: preemptsOnWake) { [weak self] in self?.tick() ?? -1 }
        loop.withLock { $0 = created }
        try register(listener: listener)
    }

    deinit {
        stop()
        changes.deallocate()
    }

    private var pollLoop: PollLoop? { loop.withLock { $0 } }

    /// Serves until the task is cancelled, then drops every connection and stops.
    public func run() async {
        await withTaskCancellationHandler {
            while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
        } onCancel: { [self] in
            stop()
        }
    }

    /// Serves until the process ends (`baton-harness inbox loopback serve`, the test harness's
    /// server process).
    package func serve() -> Never {
        while true { pause() }
    }

    private func stop() {
        let fds = state.withLock { state -> [Int32] in
            state.stopped = true
            return Array(state.openByFD.keys)
        }
        // Only numbers the loop still has (it closes a connection whose end it saw): one it
        // closed may name another socket by now.
        pollLoop?.withRegistered { registered in
            for fd in fds where registered.contains(fd) { shutdown(fd, Int32(SHUT_RDWR)) }
        }
        pollLoop?.stop()
    }

    private func register(listener: Int32) throws {
        try pollLoop?.add(listener, handledLast: true) { [weak self] _ in
            guard let self else { return false }
            while true {
                let client = baton_accept_cloexec(listener)
                if client < 0 { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED }
                LoopbackSocket.noDelay(client)
                guard self.opened(client) else { close(client); continue }
                // Read what is already queued before accepting the next connection: a client
                // that closed before a newer one connected is recorded closed before the newer
                // one opens, even when both wait in the backlog of one batch.
                if self.readable(client) {
                    do {
                        try self.pollLoop?.add(client) { [weak self] _ in self?.readable(client) ?? false }
                    } catch {
                        self.closed(client) // `add` closed it: recorded as a dropped connection
                    }
                } else {
                    close(client)
                }
            }
        }
    }

    private func opened(_ fd: Int32) -> Bool {
        let now = baton_monotonic_ns()
        return state.withLock { state in
            guard !state.stopped else { return false }
            state.order += 1
            let id = state.records.count
            state.records.append(Record(id: id, openedAt: now, openedOrder: state.order))
            state.openByFD[fd] = id
            state.splitters[fd] = LineSplitter()
            noteChange()
            return true
        }
    }

    /// Wakes the threads and the tasks waiting for a change of the records: an open, a `HELLO`,
    /// a `PING`, a close, a drop (called under the state's lock, after the change).
    private func noteChange() {
        baton_add32(changes, 1)
        if baton_load32(changes + 1) > 0 { AddressWait.wakeAll(changes) }
        recordChanges.notify()
    }

    /// Sleeps in the kernel until a connection that said `HELLO` with `name` (any open
    /// connection when `name` is nil) is open, or `timeout` has passed.
    /// - Returns: Whether it is open.
    package func waitForOpenConnection(named name: String? = nil, timeout: Duration) -> Bool {
        waitForOpenConnections(timeout: timeout) { $0.contains { name == nil || $0.name == name } }
    }

    /// Sleeps in the kernel until a connection that said `HELLO` with `name` and came after the
    /// connection `id` (its ``Record/id`` is larger) is open, or `timeout` has passed.
    ///
    /// A benchmark that preempts a holder round after round waits with this for the holder's
    /// *next* connection: a wait for any open connection with its name would also be ended by
    /// the connection it just preempted, while the server's thread has not yet read that
    /// connection's end (on a loaded machine it may not run for milliseconds), and the next
    /// round would then start before the holder is back.
    /// - Returns: That connection's ``Record/id`` (the latest, if several are open), or `nil`
    ///   at the timeout.
    package func waitForOpenConnection(named name: String, after id: Int, timeout: Duration) -> Int? {
        var found: Int?
        guard waitForOpenConnections(timeout: timeout, until: { records in
            found = records.filter { $0.name == name && $0.id > id }.map(\.id).max()
            return found != nil
        }) else { return nil }
        return found
    }

    /// Sleeps in the kernel until `condition` holds for ``openConnections``, looking again at
    /// every open, `HELLO` and close, or until `timeout` has passed.
    /// - Returns: Whether it holds.
    package func waitForOpenConnections(timeout: Duration, until condition: ([Record]) -> Bool) -> Bool {
        let deadline = Deadline.after(timeout)
        baton_add32(changes + 1, 1)
        defer { baton_sub32(changes + 1, 1) }
        while true {
            let seen = baton_load32(changes)
            if condition(openConnections) { return true }
            if deadline.hasPassed { return false }
            _ = AddressWait.wait(on: changes, expecting: seen, timeoutNanoseconds: deadline.sleepTimeout)
        }
    }

    /// Reads what the client sent; `false` when it closed.
    private func readable(_ fd: Int32) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if count > 0 {
                let lines = state.withLock { $0.splitters[fd]?.append(buffer[0..<count]) } ?? []
                for line in lines { handle(line, from: fd) }
                continue
            }
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return true }
            if count < 0 && errno == EINTR { continue }
            closed(fd)
            return false
        }
    }

    // MARK: The protocol

    private func handle(_ text: String, from fd: Int32) {
        var events: [Event] = []
        var pushes: [String] = []
        state.withLock { state in
            guard let record = state.openByFD[fd] else { return }
            switch LoopbackLine(text) {
            case .hello(let name, let pid, let epoch):
                greet(&state, fd: fd, record: record, name: name, pid: pid, epoch: epoch, events: &events)
            case .ping:
                state.records[record].pings += 1
                noteChange()
            case .ack(let id):
                guard let index = state.messages.firstIndex(where: { $0.id == id && $0.deliveredTo == fd }) else { return }
                state.messages.remove(at: index)
                state.acked += 1
                events.append(.acknowledged(id: id))
            case .push(let id, let payload):
                if !state.messages.contains(where: { $0.id == id }) {
                    add(&state, id: id, payload: payload, events: &events, pushes: &pushes)
                }
                LoopbackSocket.write(fd, "OK\n")
            case .stats:
                LoopbackSocket.write(fd, "STATS cores=\(state.cores) fetches=\(state.fetches) pushes=\(state.pushes) acked=\(state.acked) pending=\(state.messages.count) overlaps=\(state.overlaps)\n")
            case .delay(let milliseconds):
                state.delay = UInt64(milliseconds) * 1_000_000
                LoopbackSocket.write(fd, "OK\n")
            case .message, .idle, .reply, nil:
                LoopbackSocket.write(fd, "ERROR unknown command\n")
            }
        }
        report(events, pushes: pushes)
    }

    private func greet(_ state: inout State, fd: Int32, record: Int, name: String, pid: Int32, epoch: UInt64, events: inout [Event]) {
        state.records[record].name = name
        state.records[record].pid = pid
        state.records[record].epoch = epoch
        state.cores += 1
        events.append(.coreConnected(pid: pid, epoch: epoch))
        noteChange()
        guard messaging else { return }
        let others = state.openByFD.filter { $0.key != fd && state.records[$0.value].isCore }.map(\.value)
        if !others.isEmpty {
            state.overlapChecks.append((record, baton_monotonic_ns() + Self.overlapGrace, others))
        }
        // Messages delivered to an older connection still open go to the newest core.
        for index in state.messages.indices where state.messages[index].deliveredTo != nil {
            state.messages[index].deliveredTo = nil
        }
        state.nextSend = baton_monotonic_ns() + state.delay
        state.owesIdle = true
        pollLoop?.wake()
    }

    private func add(_ state: inout State, id: String, payload: [UInt8], events: inout [Event], pushes: inout [String]) {
        state.pushes += 1
        state.messages.append(Message(id: id, payload: payload, sent: baton_monotonic_ns()))
        state.owesIdle = true
        events.append(.received(id: id))
        if newestCore(state) == nil { pushes.append(id) }
        pollLoop?.wake()
    }

    private func newestCore(_ state: State) -> Int32? {
        state.openByFD.filter { state.records[$0.value].isCore && state.records[$0.value].isOpen }.max { $0.value < $1.value }?.key
    }

    /// Sends what is due to the newest core and judges the overlaps that are due; returns the
    /// poll timeout until the next thing due.
    private func tick() -> Int32 {
        var events: [Event] = []
        let timeout = state.withLock { state -> Int32 in
            let now = baton_monotonic_ns()
            var soonest: UInt64?
            for check in state.overlapChecks where check.due <= now {
                let still = check.others.filter { state.records[$0].isOpen }
                guard !still.isEmpty, state.records[check.record].isOpen || state.records[check.record].closedAt! > check.due else { continue }
                state.overlaps += 1
                let record = state.records[check.record]
                events.append(.overlap(pid: record.pid ?? 0, epoch: record.epoch ?? 0, others: still.compactMap { state.records[$0].pid }))
            }
            state.overlapChecks.removeAll { $0.due <= now }
            for check in state.overlapChecks { soonest = min(soonest ?? .max, check.due) }
            if let core = newestCore(state), !state.stopped {
                while state.nextSend <= now, let index = state.messages.firstIndex(where: { $0.deliveredTo == nil }) {
                    state.messages[index].deliveredTo = core
                    state.fetches += 1
                    let message = state.messages[index]
                    LoopbackSocket.write(core, LoopbackLine.message(LoopbackMessage(id: message.id, sent: message.sent, payload: message.payload)).text)
                    events.append(.delivered(id: message.id, pid: state.records[state.openByFD[core]!].pid ?? 0))
                    if state.delay > 0 { state.nextSend = now + state.delay }
                }
                if state.messages.contains(where: { $0.deliveredTo == nil }) {
                    soonest = min(soonest ?? .max, state.nextSend)
                } else if state.owesIdle {
                    state.owesIdle = false
                    LoopbackSocket.write(core, "IDLE\n")
                }
            }
            guard let soonest else { return -1 }
            return soonest <= now ? 0 : Int32(min((soonest - now) / 1_000_000 + 1, 60_000))
        }
        report(events, pushes: [])
        return timeout
    }

    private func closed(_ fd: Int32) {
        let now = baton_monotonic_ns()
        var events: [Event] = []
        var pushes: [String] = []
        state.withLock { state in
            guard let id = state.openByFD.removeValue(forKey: fd) else { return }
            state.splitters[fd] = nil
            if state.records[id].closedAt == nil {
                state.order += 1
                state.records[id].closedAt = now
                state.records[id].closedOrder = state.order
                state.records[id].closedBy = "client"
            }
            noteChange()
            if let pid = state.records[id].pid { events.append(.coreDisconnected(pid: pid)) }
            guard messaging else { return }
            var orphans: [String] = []
            for index in state.messages.indices where state.messages[index].deliveredTo == fd {
                state.messages[index].deliveredTo = nil
                orphans.append(state.messages[index].id)
            }
            if newestCore(state) != nil {
                state.owesIdle = true
            } else if !state.stopped {
                pushes = orphans
            }
        }
        report(events, pushes: pushes, again: true)
        if messaging { pollLoop?.wake() }
    }

    private func report(_ events: [Event], pushes: [String], again: Bool = false) {
        for event in events { onEvent(event) }
        for id in pushes {
            onEvent(.pushed(id: id, again: again))
            onPush(id)
        }
    }

    // MARK: Commands

    /// Sends a new message to the user: delivered to the newest core, or pushed.
    /// - Parameters:
    ///   - id: A unique message id (no spaces).
    ///   - payload: Its content.
    public func send(id: String, payload: [UInt8]) {
        var events: [Event] = []
        var pushes: [String] = []
        state.withLock { add(&$0, id: id, payload: payload, events: &events, pushes: &pushes) }
        report(events, pushes: pushes)
    }

    /// Every connection seen so far.
    package var records: [Record] { state.withLock { $0.records } }

    /// The connections open now, oldest first.
    ///
    /// Read under the lock from the open ones alone: a copy of all ``records`` held outside
    /// the lock (as a filter of them would) makes the server's thread copy the whole array at
    /// its next change (copy on write), thousands of records in a long benchmark, while a
    /// caller polls this between rounds.
    package var openConnections: [Record] {
        state.withLock { state in
            state.openByFD.values.sorted().compactMap { state.records[$0].isOpen ? state.records[$0] : nil }
        }
    }

    /// How many times a core connected while another core's connection was still open.
    public var overlappingConnections: Int { state.withLock { $0.overlaps } }

    /// Messages received, and acknowledged by a core; messages not yet acknowledged.
    public var counts: (sent: Int, acknowledged: Int, pending: Int) {
        state.withLock { ($0.pushes, $0.acked, $0.messages.count) }
    }

    /// Drops every open connection now (the clients see the end of the stream); returns how
    /// many were dropped.
    @discardableResult
    package func dropAll() -> Int {
        // Every client descriptor is closed only after `closed(_:)` removed it from `openByFD`
        // under this lock, so the descriptors listed there are still open.
        let now = baton_monotonic_ns()
        return state.withLock { state -> Int in
            var dropped = 0
            for (fd, id) in state.openByFD where state.records[id].closedAt == nil {
                shutdown(fd, Int32(SHUT_RDWR))
                state.order += 1
                state.records[id].closedAt = now
                state.records[id].closedOrder = state.order
                state.records[id].closedBy = "server"
                dropped += 1
            }
            if dropped > 0 { noteChange() }
            return dropped
        }
    }

    /// Stops accepting: the port is closed, so connection attempts are refused.
    package func refuse() {
        let listener = state.withLock { state -> Int32 in
            defer { state.listener = -1 }
            return state.listener
        }
        guard listener >= 0 else { return }
        pollLoop?.remove(listener)
    }

    /// Listens again on the same port.
    package func accept() throws {
        guard state.withLock({ $0.listener < 0 }) else { return }
        let (listener, _) = try LoopbackSocket.listening(port: port)
        state.withLock { $0.listener = listener }
        try register(listener: listener)
    }

    /// Waits, suspended, until `predicate` holds for the records, looking again at every change
    /// of them (an open, a `HELLO`, a `PING`, a close, a drop); a test helper.
    /// - Returns: The records that satisfied `predicate`.
    /// - Throws: `timedOut` (with the records as they stood) when `timeout` seconds pass first;
    ///   `CancellationError` when the task is cancelled.
    @discardableResult
    package func waitUntil(timeout: Double = 20, _ predicate: ([Record]) -> Bool) async throws -> [Record] {
        let deadline = Deadline.after(.milliseconds(Int64(timeout * 1000)))
        while true {
            // Read before the records: a change after this look moves it, and ends the wait.
            let seen = recordChanges.snapshot()
            let snapshot = records
            if predicate(snapshot) { return snapshot }
            do {
                try await recordChanges.wait(after: seen, deadline: deadline)
            } catch let error as BatonError where error.code == .timedOut {
                throw BatonError(.timedOut, "the loopback server's records did not reach the expected state within \(timeout)s: \(records)")
            }
        }
    }

    /// Whether no two connections were ever open at the same time, in the server's own order
    /// of events (a close and an accept seen in one batch are ordered close first).
    package static func neverOverlapped(_ records: [Record]) -> Bool {
        overlaps(records).isEmpty
    }

    /// Each connection that opened while the one opened before it was still open, with that
    /// one, in the server's own order of events.
    package static func overlaps(_ records: [Record]) -> [(earlier: Record, later: Record)] {
        let sorted = records.sorted { $0.openedOrder < $1.openedOrder }
        return zip(sorted, sorted.dropFirst()).filter { previous, next in
            guard let closed = previous.closedOrder else { return true }
            return closed >= next.openedOrder
        }.map { (earlier: $0, later: $1) }
    }
}
