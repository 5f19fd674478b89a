import Foundation
import Synchronization
import BatonLoopback
import BatonTestSupport
import Testing
@testable import Baton
import BatonFixtures

/// A value shared between a test and its child tasks.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<R: Sendable>(_ body: (inout sending Value) -> sending R) -> R { mutex.withLock(body) }
}

/// Collects a supervisor's states in the background of a test.
final class StateLog: Sendable {
    private let entries = Mutex<[(state: ConnectionState, at: ContinuousClock.Instant)]>([])

    func append(_ state: ConnectionState) { entries.withLock { $0.append((state, .now)) } }

    var states: [ConnectionState] { entries.withLock { $0.map(\.state) } }
    var timed: [(state: ConnectionState, at: ContinuousClock.Instant)] { entries.withLock { $0 } }
    var count: Int { entries.withLock { $0.count } }

    /// Waits (polling, a test helper) until `predicate` holds for the states.
    func waitUntil(timeout: Double = 20, _ what: String, _ predicate: ([ConnectionState]) -> Bool) async throws {
        let deadline = ContinuousClock.now.advanced(by: .milliseconds(Int64(timeout * 1000)))
        while !predicate(states) {
            if ContinuousClock.now >= deadline { throw TestFailure("timed out waiting for \(what); states: \(states)") }
            try await Task.sleep(for: .milliseconds(2))
        }
    }
}

@discardableResult
/// Runs `body` while `supervisor` runs and its states are logged; stops it afterwards.
func withSupervisor<C: SupervisedConnection, R: Sendable>(
    _ supervisor: ConnectionSupervisor<C>,
    _ body: @Sendable (StateLog) async throws -> R
) async throws -> R {
    let log = StateLog()
    let states = supervisor.states()
    return try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { for await state in states { log.append(state) } }
        group.addTask { try await supervisor.run() }
        defer { group.cancelAll() }
        return try await body(log)
    }
}

extension ConnectionState {
    var attempt: Int? {
        switch self {
        case .connecting(let attempt), .waiting(_, let attempt): return attempt
        default: return nil
        }
    }
    var isWaiting: Bool { if case .waiting = self { return true } else { return false } }
}

func ipCommandAvailable() -> Bool {
    getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/sbin/ip")
}

@discardableResult
func runIP(_ arguments: [String]) throws -> Int32 {
    try runProgram("/usr/sbin/ip", arguments).status
}

/// Wraps a permit to observe the moment each grant is released.
struct ObservedPermit: ConnectionPermit {
    let inner: any ConnectionPermit
    let onRelease: @Sendable () -> Void

    func acquire(deadline: Deadline) async throws -> any ConnectionGrant {
        Grant(inner: try await inner.acquire(deadline: deadline), onRelease: onRelease)
    }

    struct Grant: ConnectionGrant {
        let inner: any ConnectionGrant
        let onRelease: @Sendable () -> Void
        func stopRequested() async throws { try await inner.stopRequested() }
        func withCriticalSection<R: Sendable>(_ body: @Sendable () async throws -> R) async throws -> R {
            try await inner.withCriticalSection(body)
        }
        func release() async {
            onRelease()
            await inner.release()
        }
        var stopRequestExecutor: (any TaskExecutor)? { inner.stopRequestExecutor }
    }
}

/// A loopback connection that records the names of the threads its first `close()` ran on and
/// its first `closed()` was awaited on.
final class ThreadRecordingConnection: SupervisedConnection {
    let client: LoopbackClient
    let closedOn = Mutex<String?>(nil)
    let closedAwaitedOn = Mutex<String?>(nil)

    init(_ client: LoopbackClient) { self.client = client }

    /// The calling thread's name (Linux: its `comm`).
    private static func threadName() -> String {
        ((try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "")
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func closed() async {
        let name = Self.threadName()
        closedAwaitedOn.withLock { if $0 == nil { $0 = name } }
        await client.closed()
    }
    func ping() async throws { try await client.ping() }
    func close() async {
        let name = Self.threadName()
        closedOn.withLock { if $0 == nil { $0 = name } }
        await client.close()
    }
}

struct Outcome: Sendable {
    var code: BatonError.Code?
    var at: ContinuousClock.Instant
}

@Suite("Lifecycle", .serialized)
struct LifecycleTests {
    // MARK: Backoff

    @Test func backoffCapsGrowAndJitterStaysBelowThem() {
        let backoff = ConnectionBackoff(initialDelay: .milliseconds(100), maximumDelay: .seconds(1), multiplier: 2)
        #expect(backoff.cap(forAttempt: 0) == .zero)
        #expect(backoff.cap(forAttempt: 1) == .milliseconds(100))
        #expect(backoff.cap(forAttempt: 2) == .milliseconds(200))
        #expect(backoff.cap(forAttempt: 4) == .milliseconds(800))
        #expect(backoff.cap(forAttempt: 5) == .seconds(1))
        #expect(backoff.cap(forAttempt: 1_000) == .seconds(1))
        var generator = SystemRandomNumberGenerator()
        var sawSmall = false, sawLarge = false
        for _ in 0..<2_000 {
            let delay = backoff.delay(forAttempt: 3, using: &generator)
            #expect(delay >= .zero && delay <= .milliseconds(400))
            if delay < .milliseconds(100) { sawSmall = true }
            if delay > .milliseconds(300) { sawLarge = true }
        }
        #expect(sawSmall && sawLarge, "full jitter spreads delays over the whole range")
        let exact = ConnectionBackoff(initialDelay: .milliseconds(100), jitter: false)
        #expect(exact.delay(forAttempt: 2) == .milliseconds(200))
        // Nonsense input is clamped, not trusted.
        let clamped = ConnectionBackoff(initialDelay: .seconds(-1), maximumDelay: .seconds(-5), multiplier: .nan)
        #expect(clamped.cap(forAttempt: 3) == .zero)
    }

    // MARK: Supervisor against a real loopback server

    @Test func reconnectsAtOnceAfterServerDrop() async throws {
        let server = try LoopbackServer()
        let port = server.port
        let supervisor = ConnectionSupervisor(
            configuration: .init(backoff: ConnectionBackoff(stablePeriod: .zero), keepAliveInterval: nil)
        ) { try LoopbackClient(port: port, hello: .init(name: "client")) }
        try await withSupervisor(supervisor) { log in
            try await log.waitUntil("the first connection") { $0.contains { $0.isConnected } }
            try await server.waitUntil { $0.count == 1 && $0[0].isOpen }
            let before = log.count
            for round in 1...3 {
                #expect(server.dropAll() == 1)
                try await server.waitUntil { $0.count == round + 1 && $0[round].isOpen }
                try await log.waitUntil("reconnection \(round)") { $0.dropFirst(before).filter(\.isConnected).count == round }
            }
            // Straight from the drop to a new attempt 0: no back-off wait in between.
            let afterDrops = log.states.dropFirst(before)
            #expect(!afterDrops.contains { $0.isWaiting })
            #expect(afterDrops.filter { $0 == .connecting(attempt: 0) }.count == 3)
            #expect(server.records.filter(\.isOpen).count == 1)
            #expect(supervisor.connectionCount == 4)
        }
        #expect(supervisor.currentState == .stopped)
        try await server.waitUntil { $0.allSatisfy { !$0.isOpen } }
    }

    /// A `connect()` that returns without suspending (a blocking loopback connect) runs before
    /// the supervisor tells its subscribers that an attempt started (telling them wakes their
    /// tasks, a thread's wake-up on the way to the connection); they still see `connecting`
    /// before `connected`.
    @Test func aConnectThatDoesNotSuspendIsUpBeforeConnectingIsPublished() async throws {
        let server = try LoopbackServer()
        let port = server.port
        let supervisorBox = Locked<ConnectionSupervisor<LoopbackClient>?>(nil)
        let statesInConnect = Locked<[ConnectionState]>([])
        let supervisor = ConnectionSupervisor(configuration: .init(keepAliveInterval: nil)) {
            if let state = supervisorBox.withLock({ $0 })?.currentState { statesInConnect.withLock { $0.append(state) } }
            return try LoopbackClient(port: port, hello: .init(name: "client"))
        }
        supervisorBox.withLock { $0 = supervisor }
        try await withSupervisor(supervisor) { log in
            try await log.waitUntil("the connection") { $0.contains { $0.isConnected } }
            #expect(statesInConnect.withLock { $0 } == [.waitingForPermit])
            let states = log.states
            let connecting = try #require(states.firstIndex(of: .connecting(attempt: 0)), "states: \(states)")
            let connected = try #require(states.firstIndex { $0.isConnected }, "states: \(states)")
            #expect(connecting < connected)
        }
    }

    @Test func backsOffUnderRepeatedFailureAndRecovers() async throws {
        let server = try LoopbackServer()
        let port = server.port
        let backoff = ConnectionBackoff(initialDelay: .milliseconds(20), maximumDelay: .milliseconds(160), stablePeriod: .seconds(60))
        let supervisor = ConnectionSupervisor(configuration: .init(backoff: backoff, keepAliveInterval: nil)) {
            try LoopbackClient(port: port)
        }
        try await withSupervisor(supervisor) { log in
            try await server.waitUntil { $0.count == 1 }
            server.refuse()
            server.dropAll()
            try await log.waitUntil("six delayed attempts") { $0.filter(\.isWaiting).count >= 6 }
            #expect(server.records.count == 1, "nothing connects while the server refuses")
            let waits = log.timed.compactMap { entry -> (attempt: Int, delay: Duration)? in
                guard case .waiting(let until, let attempt) = entry.state else { return nil }
                return (attempt, until - entry.at)
            }
            // Attempts count up (the drop's immediate retry was attempt 1 after the first
            // connection's attempt 0), and every delay stays under its cap.
            #expect(waits.map(\.attempt) == Array(waits[0].attempt..<(waits[0].attempt + waits.count)))
            for wait in waits {
                #expect(wait.delay <= backoff.cap(forAttempt: wait.attempt))
            }
            #expect(backoff.cap(forAttempt: waits.last!.attempt) == .milliseconds(160), "the cap is reached")
            let error = try #require(supervisor.lastError as? BatonError)
            #expect(error.message.contains("refused"))
            try server.accept()
            try await server.waitUntil { $0.count == 2 && $0[1].isOpen }
            try await log.waitUntil("reconnected") { $0.last?.isConnected == true }
        }
    }

    @Test func retriesAtOnceWhenReachabilityReportsTheNetworkBack() async throws {
        let server = try LoopbackServer()
        let port = server.port
        let reachability = ManualReachability(.reachable)
        // Without the event the next attempt would come a minute later.
        let backoff = ConnectionBackoff(initialDelay: .seconds(60), stablePeriod: .seconds(60), jitter: false)
        let supervisor = ConnectionSupervisor(reachability: reachability, configuration: .init(backoff: backoff, keepAliveInterval: nil)) {
            try LoopbackClient(port: port)
        }
        try await withSupervisor(supervisor) { log in
            try await server.waitUntil { $0.count == 1 }
            server.refuse()
            reachability.report(.unreachable)
            server.dropAll()
            try await log.waitUntil("a one-minute back-off") { $0.contains { $0.isWaiting } }
            reachability.report(.unreachable) // still down: no retry
            try await Task.sleep(for: .milliseconds(100))
            #expect(log.states.last?.isWaiting == true)
            try server.accept()
            reachability.report(.reachable, interfaces: ["eth0"])
            try await server.waitUntil(timeout: 20) { $0.count == 2 && $0[1].isOpen }
            try await log.waitUntil("connected after the network came back") { $0.last?.isConnected == true }
        }
    }

    @Test(.enabled(if: ipCommandAvailable(), "needs root and iproute2"))
    func retriesAtOnceOnARealKernelNetworkChange() async throws {
        let monitor = try NetlinkReachability()
        try #require(monitor.currentPath.status == .reachable, "needs a usable interface besides loopback")
        let server = try LoopbackServer()
        let port = server.port
        let backoff = ConnectionBackoff(initialDelay: .seconds(60), stablePeriod: .seconds(60), jitter: false)
        let supervisor = ConnectionSupervisor(reachability: monitor, configuration: .init(backoff: backoff, keepAliveInterval: nil)) {
            try LoopbackClient(port: port)
        }
        try await withSupervisor(supervisor) { log in
            try await server.waitUntil { $0.count == 1 }
            server.refuse()
            server.dropAll()
            try await log.waitUntil("a one-minute back-off") { $0.contains { $0.isWaiting } }
            try server.accept()
            try await Task.sleep(for: .milliseconds(100))
            #expect(log.states.last?.isWaiting == true, "no retry before the kernel event")
            #expect(server.records.count == 1)
            // A real kernel event: an address appears on lo. Up to three tries, each with a new
            // address: the kernel drops a multicast message for a socket whose receive queue is
            // full, and the suite runs beside this test (one fresh-clone CI run saw no retry in
            // 20 s after its only address). A monitor that does not report events fails all
            // three; without the event the retry would come a minute later.
            var reconnected = false
            for _ in 1...3 where !reconnected {
                let address = "127.0.\(Int.random(in: 100...250)).\(Int.random(in: 1...250))/32"
                #expect(try runIP(["addr", "add", address, "dev", "lo"]) == 0)
                defer { _ = try? runIP(["addr", "del", address, "dev", "lo"]) }
                reconnected = (try? await server.waitUntil(timeout: 7) { $0.count == 2 && $0[1].isOpen }) != nil
            }
            #expect(reconnected, "no reconnection after three kernel address events: \(server.records)")
        }
    }

    @Test(.enabled(if: ipCommandAvailable(), "needs root and iproute2"))
    func netlinkMonitorParsesRealKernelMessages() async throws {
        let monitor = try NetlinkReachability()
        let updates = monitor.updates()
        // Up to three tries, each with a new address and its own subscription. One CI run of the
        // whole suite saw no message for its address in 20 s (once in many runs; not
        // reproduced): the kernel drops a multicast message for a socket whose receive queue is
        // full, and the suite runs beside this test. A monitor that stopped reading still fails
        // all three tries.
        var result: (address: String, seen: [NetlinkMessage])?
        for attempt in 1...3 where result == nil {
            let messages = monitor.messages()
            let address = "127.0.\(Int.random(in: 100...250)).\(Int.random(in: 1...250))"
            do {
                let seen = try await withThrowingTaskGroup(of: [NetlinkMessage].self) { group in
                    group.addTask {
                        var collected: [NetlinkMessage] = []
                        for await message in messages {
                            collected.append(message)
                            if message.kind == .addressRemoved && message.address == address { break }
                        }
                        return collected
                    }
                    group.addTask {
                        try await Task.sleep(for: .seconds(7))
                        throw TestFailure("no rtnetlink message for \(address) within 7 s (try \(attempt) of 3)")
                    }
                    try await Task.sleep(for: .milliseconds(50))
                    #expect(try runIP(["addr", "add", "\(address)/32", "dev", "lo"]) == 0)
                    #expect(try runIP(["addr", "del", "\(address)/32", "dev", "lo"]) == 0)
                    defer { group.cancelAll() }
                    return try await group.next()!
                }
                result = (address, seen)
            } catch let failure as TestFailure where attempt < 3 {
                print("netlinkMonitorParsesRealKernelMessages: \(failure); trying again")
            }
        }
        let (address, seen) = try #require(result)
        let added = try #require(seen.first { $0.kind == .addressAdded && $0.address == address })
        #expect(added.interfaceIndex == 1 && added.prefixLength == 32 && added.interfaceName == "lo")
        #expect(seen.contains { $0.kind == .addressRemoved && $0.address == address })
        var iterator = updates.makeAsyncIterator()
        let first = await iterator.next()
        #expect(first?.status == .reachable || first?.status == .unreachable)
        // The monitor publishes the batch's path just after its messages: wait for it (reading
        // `currentPath` at once raced the monitor's thread on a loaded runner).
        let published = try await within(20, "a path published for the changes") {
            for await path in monitor.updates() { // the latest path first, then later ones
                if path.generation >= 1 { return true }
            }
            return false
        }
        #expect(published, "the changes were published as new paths")
        #expect(monitor.currentPath.generation >= 1)

        // Malformed input never crashes the parser.
        let garbage: [UInt8] = [200, 0, 0, 0, 20, 0] + Array(repeating: 0xff, count: 40)
        #expect(garbage.withUnsafeBytes { NetlinkMessage.parse($0) }.isEmpty)
    }

    @Test func aHangingConnectIsCancelledAtTheConnectTimeout() async throws {
        let cancelledAttempts = Locked(0)
        let supervisor = ConnectionSupervisor<LoopbackClient>(
            configuration: .init(backoff: ConnectionBackoff(initialDelay: .milliseconds(10), maximumDelay: .milliseconds(20)),
                                 keepAliveInterval: nil, connectTimeout: .milliseconds(50))
        ) {
            do {
                try await Task.sleep(for: .seconds(600)) // a server that never answers
            } catch {
                cancelledAttempts.withLock { $0 += 1 }
                throw error
            }
            throw TestFailure("unreachable")
        }
        try await withSupervisor(supervisor) { log in
            try await log.waitUntil("three timed-out attempts") { $0.filter(\.isWaiting).count >= 3 }
        }
        #expect(cancelledAttempts.withLock { $0 } >= 3, "each attempt was cancelled, not abandoned")
        #expect((supervisor.lastError as? BatonError)?.code == .timedOut)
    }

    @Test func keepAlivePingsReachTheServer() async throws {
        let server = try LoopbackServer()
        let port = server.port
        let supervisor = ConnectionSupervisor(configuration: .init(keepAliveInterval: .milliseconds(20))) {
            try LoopbackClient(port: port)
        }
        try await withSupervisor(supervisor) { _ in
            try await server.waitUntil { $0.first.map { $0.pings >= 3 } ?? false }
        }
    }

    @Test func suspensionClosesTheConnectionBeforeThePermitsLockIsReleased() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let server = try LoopbackServer()
        let port = server.port
        let closedAtRelease = Locked<[Bool]>([])
        let current = Locked<LoopbackClient?>(nil)
        let permit = ObservedPermit(inner: HandoverPermit(container: container, name: "suspend", priority: 1)) {
            closedAtRelease.withLock { $0.append(current.withLock { $0?.isClosed } ?? true) }
        }
        let supervisor = ConnectionSupervisor(container: container, permit: permit, configuration: .init(keepAliveInterval: nil)) {
            let connection = try LoopbackClient(port: port)
            current.withLock { $0 = connection }
            return connection
        }
        try await withSupervisor(supervisor) { log in
            try await log.waitUntil("connected") { $0.last?.isConnected == true }
            #expect(!ProcLocks.held(by: getpid(), under: directory.path).isEmpty, "the permit's lock is held")
            await container.suspend()
            // When suspend() returns the connection is closed and no lock is held.
            #expect(supervisor.connection == nil)
            #expect(current.withLock { $0?.isClosed } == true)
            #expect(closedAtRelease.withLock { $0 } == [true], "closed before the permit was released")
            #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
            try await server.waitUntil { $0.count == 1 && !$0[0].isOpen }
            try await log.waitUntil("waiting for the permit") { $0.last == .waitingForPermit }
            await #expect(throws: BatonError.self) { try await supervisor.run() } // already running
            try await container.resume()
            try await server.waitUntil { $0.count == 2 && $0[1].isOpen }
        }
    }

    // MARK: Sensitive tasks

    @Test func sensitiveTaskDefersAStopRequest() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let server = try LoopbackServer()
        let port = server.port
        let permit = LocalConnectionPermit()
        let supervisor = ConnectionSupervisor(container: container, permit: permit, configuration: .init(keepAliveInterval: nil)) {
            try LoopbackClient(port: port)
        }
        let background = LocalBackgroundTasks()
        let sensitive = SensitiveTasks(container: container, provider: background, criticalSection: supervisor)
        let (finish, finishContinuation) = AsyncStream<Void>.makeStream()
        let (entered, enteredContinuation) = AsyncStream<Void>.makeStream()
        let revoked = Locked(false)
        let connectionAtRevoke = Locked<LoopbackClient?>(nil)
        try await withSupervisor(supervisor) { log in
            try await log.waitUntil("connected") { $0.last?.isConnected == true }
            let connection = try #require(supervisor.connection)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    try await sensitive.withSensitiveTask("payment") {
                        try await sensitive.withSensitiveTask("nested") {
                            enteredContinuation.yield()
                            for await _ in finish { break }
                        }
                    }
                }
                // Both tasks have begun (a fixed sleep here raced the group's task on a loaded runner).
                for await _ in entered { break }
                #expect(sensitive.running == ["nested", "payment"])
                #expect(background.activeTasks == ["nested", "payment"])
                group.addTask {
                    try await permit.revoke()
                    revoked.withLock { $0 = true }
                    connectionAtRevoke.withLock { $0 = supervisor.connection }
                    #expect(connection.isClosed, "the connection was closed before the permit was given back")
                }
                // The stop request waits for the sensitive task: the connection stays up.
                try await Task.sleep(for: .milliseconds(300))
                #expect(revoked.withLock { $0 } == false)
                #expect(server.records.count == 1 && server.records[0].isOpen)
                #expect(log.states.last?.isConnected == true)
                finishContinuation.yield()
                try await group.waitForAll()
            }
            #expect(revoked.withLock { $0 })
            #expect(connectionAtRevoke.withLock { $0 } == nil)
            try await server.waitUntil { !$0[0].isOpen }
            try await log.waitUntil("waiting for the permit") { $0.last == .waitingForPermit }
            #expect(background.begunCount == 2 && background.endedCount == 2 && background.activeTasks.isEmpty)
            permit.allow()
            try await server.waitUntil { $0.count == 2 && $0[1].isOpen }
        }
    }

    @Test func sensitiveTaskDefersARolePreemptionByAnotherProcess() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let server = try LoopbackServer()
        let port = server.port
        let role = try Role(container, name: "core")
        let supervisor = ConnectionSupervisor(
            container: container, permit: RolePermit(role, priority: .executor, kind: "extension"),
            configuration: .init(keepAliveInterval: nil)
        ) { try LoopbackClient(port: port, hello: .init(name: "extension")) }
        let background = LocalBackgroundTasks()
        let sensitive = SensitiveTasks(container: container, provider: background, criticalSection: supervisor)
        let (finish, finishContinuation) = AsyncStream<Void>.makeStream()
        try await withSupervisor(supervisor) { log in
            try await log.waitUntil("connected") { $0.last?.isConnected == true }
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    try await sensitive.withSensitiveTask("payment") {
                        for await _ in finish { break }
                    }
                }
                while try role.status().holder?.state != .critical { try await Task.sleep(for: .milliseconds(2)) }
                // The app asks for the role; the sensitive task holds it off.
                let app = try ChildProcess(["role", "acquire", "core", "--role", "main", "--hold", "30", "--timeout", "30"],
                                           container: directory.path)
                while try role.status().holder?.stopRequest == nil { try await Task.sleep(for: .milliseconds(2)) }
                try await Task.sleep(for: .milliseconds(300))
                #expect(!app.lines.contains { $0.contains("\"acquired\"") })
                #expect(server.records.count == 1 && server.records[0].isOpen)
                #expect(log.states.last?.isConnected == true)
                finishContinuation.yield()
                try await group.waitForAll()
                // Then the extension closes its connection and the app gets the role.
                try await app.line(timeout: 20) { $0.contains("\"acquired\"") }
                // The lease is released only after the connection is closed.
                #expect(supervisor.connection == nil)
                try await server.waitUntil { !$0[0].isOpen }
                try await log.waitUntil("waiting for the role") { $0.last == .waitingForPermit }
                app.signal(SIGKILL)
            }
            // The app is gone: the extension takes the role back and reconnects.
            try await server.waitUntil { $0.count == 2 && $0[1].isOpen }
        }
        #expect(background.begunCount == 1 && background.endedCount == 1)
    }

    /// A role's stop request from another process is answered on the thread that received it
    /// (the signal thread): the supervisor closes its connection and releases the role there,
    /// with no hand-off to a thread of the global executor in between, although the supervisor
    /// itself runs on the global executor.
    @Test func aRoleStopRequestIsAnsweredOnTheSignalThread() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let server = try LoopbackServer()
        let port = server.port
        let role = try Role(container, name: "core")
        let connection = Locked<ThreadRecordingConnection?>(nil)
        let supervisor = ConnectionSupervisor(
            container: container, permit: RolePermit(role, priority: .executor, kind: "extension"),
            configuration: .init(keepAliveInterval: nil)
        ) {
            let made = ThreadRecordingConnection(try LoopbackClient(port: port, hello: .init(name: "extension")))
            connection.withLock { $0 = made }
            return made
        }
        try await withSupervisor(supervisor) { log in
            try await log.waitUntil("connected") { $0.last?.isConnected == true }
            let app = try ChildProcess(["role", "acquire", "core", "--role", "main", "--hold", "30", "--timeout", "30"],
                                       container: directory.path)
            defer { app.signal(SIGKILL) }
            try await app.line(timeout: 20) { $0.contains("\"acquired\"") }
            let first = try #require(connection.withLock { $0 })
            #expect(first.closedOn.withLock { $0 } == "baton-signals")
            // The live connection's end was awaited there too, so that the close resumes that
            // wait on its own thread, not by waking a pool thread before the release.
            #expect(first.closedAwaitedOn.withLock { $0 } == "baton-signals")
            // Closed before the role was released, as always.
            #expect(server.records.count == 1 && !server.records[0].isOpen)
        }
    }

    /// A stop request that arrives while a connect attempt is in flight: the holder cancels the
    /// attempt and releases the role only once the attempt has ended (a connect that completes
    /// after the release would put two processes on the server at once). The attempt here takes
    /// 300 ms to give up after its cancellation, and looks at the role's holder when it does.
    @Test func aStopRequestDuringAConnectAttemptReleasesOnlyAfterTheAttemptEnded() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let role = try Role(container, name: "core")
        let attempts = Locked(0)
        let holderWhenTheAttemptEnded = Locked<Int32?>(nil)
        let supervisor = ConnectionSupervisor<LoopbackClient>(
            container: container, permit: RolePermit(role, priority: .executor, kind: "extension"),
            configuration: .init(keepAliveInterval: nil)
        ) {
            attempts.withLock { $0 += 1 }
            do {
                try await Task.sleep(for: .seconds(600)) // a server that does not answer
            } catch {
                usleep(300_000) // tearing a handshake down, deaf to the cancellation
                let holder = try role.status().holder?.pid
                holderWhenTheAttemptEnded.withLock { $0 = holder }
                throw error
            }
            throw TestFailure("unreachable")
        }
        try await withSupervisor(supervisor) { log in
            try await log.waitUntil("connecting") { $0.last?.attempt == 0 && !$0.last!.isWaiting }
            let app = try ChildProcess(["role", "acquire", "core", "--role", "main", "--hold", "30", "--timeout", "30"],
                                       container: directory.path)
            defer { app.signal(SIGKILL) }
            try await app.line(timeout: 20) { $0.contains("\"acquired\"") }
            #expect(holderWhenTheAttemptEnded.withLock { $0 } == getpid(),
                    "the role was released before the connect attempt ended")
            #expect(attempts.withLock { $0 } == 1, "no attempt starts once the session ends")
        }
    }

    @Test func expiryCancelsTheWorkAndReleasesEveryLock() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let lock = try FileLock(container, name: "work.lock")
        let held = try #require(try lock.tryLock())
        #expect(!ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
        let background = LocalBackgroundTasks()
        let sensitive = SensitiveTasks(container: container, provider: background)
        let cancelled = Locked(false)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                let error = await #expect(throws: BatonError.self) {
                    try await sensitive.withSensitiveTask("upload") {
                        do { try await Task.sleep(for: .seconds(600)) } catch { cancelled.withLock { $0 = true }; throw error }
                    }
                }
                #expect(error?.code == .expired)
            }
            while background.activeTasks.isEmpty { try await Task.sleep(for: .milliseconds(2)) }
            background.expire()
            try await group.waitForAll()
        }
        #expect(cancelled.withLock { $0 }, "the work was cancelled")
        #expect(container.suspension.isExpired)
        #expect(!held.isHeld)
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty, "no lock survives the expiry")
        #expect(background.begunCount == 1 && background.endedCount == 1)
        // After expiry, new sensitive work is refused at once.
        await #expect(throws: BatonError.self) { try await sensitive.withSensitiveTask("late") { 1 } }
    }

    @Test func taskBegunWhenTimeIsAlreadyGoneEndsCleanly() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let background = LocalBackgroundTasks()
        background.expire() // backgrounded, no time left, before any task
        let sensitive = SensitiveTasks(container: container, provider: background)
        let error = await #expect(throws: BatonError.self) {
            try await sensitive.withSensitiveTask("late") { try await Task.sleep(for: .seconds(600)) }
        }
        #expect(error?.code == .expired)
        #expect(background.begunCount == 1 && background.endedCount == 1)
        #expect(sensitive.running.isEmpty)
        // A task that finishes normally ends its background task too.
        let otherDirectory = try TemporaryContainer()
        let other = try SharedContainer(path: otherDirectory.path)
        let fresh = LocalBackgroundTasks()
        let value = try await SensitiveTasks(container: other, provider: fresh).withSensitiveTask("quick") { 42 }
        #expect(value == 42 && fresh.begunCount == 1 && fresh.endedCount == 1)
    }

    @Test func expiryPostedByAnotherProcessReachesTheSensitiveTask() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let background = try SignalledBackgroundTasks(container: container)
        let sensitive = SensitiveTasks(container: container, provider: background)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await background.run() }
            group.addTask {
                while background.activeTasks.isEmpty { try await Task.sleep(for: .milliseconds(2)) }
                let result = try await runBaton(["lifecycle", "expire", "--pid", "\(getpid())"], container: directory.path)
                #expect(result.status == 0)
            }
            let error = await #expect(throws: BatonError.self) {
                try await sensitive.withSensitiveTask("message") { try await Task.sleep(for: .seconds(600)) }
            }
            #expect(error?.code == .expired)
            try await group.next() // the expiring process's child task (run() never ends by itself)
            group.cancelAll()
            try await group.waitForAll()
        }
        #expect(container.suspension.isExpired)
    }

    // MARK: Time budget

    @Test func expiringBudgetEndsEveryWaitInTime() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let lock = try FileLock(container, name: "busy.lock")
        let holder = try #require(try lock.tryLock())
        let budget = TimeBudget(duration: .seconds(4), warningMargin: .seconds(3), expiryMargin: .seconds(2))
        #expect(budget.warning < budget.expiry && budget.expiry < budget.end)
        #expect(Deadline(budget) == budget.deadline)
        let outcomes = Locked<[String: Outcome]>([:])
        @Sendable func record(_ name: String, _ body: @Sendable () async throws -> Void) async {
            do {
                try await body()
                outcomes.withLock { $0[name] = Outcome(code: nil, at: .now) }
            } catch {
                outcomes.withLock { $0[name] = Outcome(code: (error as? BatonError)?.code ?? BatonError.Code("other"), at: .now) }
            }
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await budget.enforce(on: container) }
            group.addTask { await record("warning") { try await budget.willExpire() } }
            group.addTask { await record("lock") { _ = try await lock.lock(deadline: budget.deadline) } }
            group.addTask { await record("signal") { _ = try await container.signals.wait(for: "never.posted", deadline: budget.deadline) } }
            group.addTask { await record("lockNoDeadline") { _ = try await lock.lock(deadline: .never) } }
            try await group.waitForAll()
        }
        let results = outcomes.withLock { $0 }
        let generous: Duration = .seconds(10)
        #expect(results["warning"]?.code == nil)
        #expect(try #require(results["warning"]).at < budget.end.advanced(by: generous))
        // The signal wait ends at the budget's deadline; the lock wait at the deadline or, if
        // the expiry came first, with `suspended` (never with the lock).
        #expect(results["signal"]?.code == .timedOut)
        #expect([.timedOut, .suspended].contains(results["lock"]?.code))
        for name in ["lock", "signal"] {
            let result = try #require(results[name])
            #expect(result.at < budget.end.advanced(by: generous))
            #expect(result.at >= budget.expiry, "\(name) did not end early")
        }
        // A wait that did not take the budget still ends, because the expiry suspends Baton.
        let unbounded = try #require(results["lockNoDeadline"])
        #expect(unbounded.code == .suspended)
        #expect(unbounded.at < budget.end.advanced(by: generous))
        #expect(container.suspension.isExpired)
        #expect(!holder.isHeld)
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
        #expect(throws: BatonError.self) { try budget.check("start an upload") }
    }

    // MARK: Two processes

    @Test func roleHandOverBetweenTwoProcessesNeverOverlaps() async throws {
        try await handOverScenario(permit: ["--role", "core"],
                                   executor: ["--role-priority", "executor"], app: ["--role-priority", "main"])
    }

    @Test func handOverBetweenTwoProcessesNeverOverlaps() async throws {
        try await handOverScenario(permit: ["--handover", "core"], executor: ["--priority", "1"], app: ["--priority", "2"])
    }

    /// An executor holds the connection; an app arrives (the executor closes, then gives the
    /// permit up), crashes (the executor reconnects at once), a second app arrives and exits
    /// cleanly. The server must never have seen two connections at once.
    private func handOverScenario(permit: [String], executor executorFlags: [String], app appFlags: [String]) async throws {
        let directory = try TemporaryContainer()
        let server = try LoopbackServer()
        let common = ["lifecycle", "supervise", "--port", "\(server.port)"] + permit + ["--keep-alive", "0.05"]
        let executor = try ChildProcess(harness: common + executorFlags + ["--name", "executor"], container: directory.path)
        try await server.waitUntil { $0.contains { $0.name == "executor" && $0.isOpen } }
        let app = try ChildProcess(harness: common + appFlags + ["--name", "app"], container: directory.path)
        try await server.waitUntil { $0.contains { $0.name == "app" && $0.isOpen } }
        try await Task.sleep(for: .milliseconds(300)) // the executor keeps asking; it must not get in
        app.signal(SIGKILL)
        _ = try await app.wait()
        try await server.waitUntil { $0.filter { $0.name == "executor" }.count == 2 && $0.last?.isOpen == true }
        let app2 = try ChildProcess(harness: common + appFlags + ["--name", "app2"], container: directory.path)
        try await server.waitUntil { $0.contains { $0.name == "app2" && $0.isOpen } }
        app2.signal(SIGTERM)
        #expect(try await app2.wait() == 0)
        try await server.waitUntil { $0.filter { $0.name == "executor" }.count == 3 && $0.last?.isOpen == true }
        executor.signal(SIGTERM)
        #expect(try await executor.wait() == 0)
        let records = try await server.waitUntil { $0.allSatisfy { !$0.isOpen } }
        #expect(records.map(\.name) == ["executor", "app", "executor", "app2", "executor"])
        #expect(LoopbackServer.neverOverlapped(records), "two processes were connected at once: \(records)")
    }
}
