import Baton
import BatonFixtures
import BatonCommandSupport
import BatonLoopback
import CBatonShims
import Foundation
import Synchronization

/// `baton bench lifecycle`: how fast the connection supervisor comes back.
///
/// - drop to connected: the loopback server drops the connection; time until the supervisor
///   reports the new connection up. Floors in the same run: a raw TCP `connect` to the same
///   server, and a hand-written blocking client that reconnects as soon as `recv` returns 0.
/// - preemption to connected: a worker process (role priority executor) holds the role and a
///   connection; this process (priority main) starts its own supervisor; time until the worker's
///   connection is closed and this one is up (this process's `connect` closure returned it), and
///   until a `states()` subscriber sees it (`..._state_seen`). Floor: the same hand-over done raw
///   (a pipe byte asks the worker, which closes its socket and `flock(LOCK_UN)`s; this process's
///   blocking `flock` returns, then it connects).
enum LifecycleBench: BenchSuite {
    static let name = "lifecycle"

    static func run(container path: String, quick: Bool) async throws -> (results: [BenchResult], notes: [String: String]) {
        let container = try SharedContainer(path: path)
        // One that only records connections: an `IDLE` line after each `HELLO` and close would
        // wake a third process's client thread in the middle of a measured hand-over. Its
        // thread does not preempt on waking (SCHED_BATCH on Linux): a real server runs on
        // another machine, and none of the measured end points waits for this thread (the
        // kernel completes a loopback connect without its accept). Its wake-ups after a close or
        // a HELLO preempted a hand-over's threads, which then waited up to a tick (4 ms) behind
        // the loaded runs' CPU-bound processes: the floor's p99 and Baton's alike.
        let server = try LoopbackServer(messaging: false, preemptsOnWake: false)
        let rounds = quick ? 200 : 2_000
        let handovers = quick ? 30 : 200

        FileHandleOutput.standardError("lifecycle bench: measuring rawConnect")
        let rawConnect = try measureRawConnect(port: server.port, rounds: rounds)
        FileHandleOutput.standardError("lifecycle bench: measuring rawReconnect")
        let rawReconnect = try measureRawReconnect(server: server, rounds: rounds)
        FileHandleOutput.standardError("lifecycle bench: measuring supervised")
        let supervised = try await withTimeout("the supervised reconnections") {
            try await measureSupervisedReconnect(server: server, rounds: rounds)
        }
        FileHandleOutput.standardError("lifecycle bench: measuring hand-overs (raw floor, global executor, signal thread, in alternating blocks)")
        let handOvers = try await withTimeout("the hand-overs") {
            try await measureHandOvers(container: container, path: path, server: server, rounds: handovers)
        }
        let (rawHandover, preemption, preemptionOnSignalThread) = (handOvers.raw, handOvers.global.samples, handOvers.signalThread.samples)
        let (global, signalThread) = (handOvers.global.overlaps, handOvers.signalThread.overlaps)
        FileHandleOutput.standardError("lifecycle bench: measuring hand-overs with every process on one processor")
        let single = try await withTimeout("the hand-overs on one processor") {
            try await measureHandOversOnOneProcessor(container: container, path: path, server: server, rounds: max(handovers / 4, handOverBlock))
        }

        let results = [
            BenchResult(name: "drop_to_connected_p50_us", value: percentile(supervised, 50), unit: "us", floorName: "raw_connect_p50_us", floor: percentile(rawConnect, 50)),
            BenchResult(name: "drop_to_connected_p99_us", value: percentile(supervised, 99), unit: "us", floorName: "raw_connect_p99_us", floor: percentile(rawConnect, 99)),
            BenchResult(name: "drop_to_connected_p50_us", value: percentile(supervised, 50), unit: "us", floorName: "raw_drop_to_reconnect_p50_us", floor: percentile(rawReconnect, 50)),
            BenchResult(name: "drop_to_connected_p99_us", value: percentile(supervised, 99), unit: "us", floorName: "raw_drop_to_reconnect_p99_us", floor: percentile(rawReconnect, 99)),
            BenchResult(name: "preemption_to_connected_p50_us", value: percentile(preemption.up, 50), unit: "us", floorName: "raw_flock_handover_connect_p50_us", floor: percentile(rawHandover, 50)),
            BenchResult(name: "preemption_to_connected_p99_us", value: percentile(preemption.up, 99), unit: "us", floorName: "raw_flock_handover_connect_p99_us", floor: percentile(rawHandover, 99)),
            BenchResult(name: "preemption_to_connected_state_seen_p50_us", value: percentile(preemption.observed, 50), unit: "us", floorName: "raw_flock_handover_connect_p50_us", floor: percentile(rawHandover, 50)),
            BenchResult(name: "preemption_to_connected_state_seen_p99_us", value: percentile(preemption.observed, 99), unit: "us", floorName: "raw_flock_handover_connect_p99_us", floor: percentile(rawHandover, 99)),
            BenchResult(name: "preemption_to_connected_signal_thread_p50_us", value: percentile(preemptionOnSignalThread.up, 50), unit: "us", floorName: "raw_flock_handover_connect_p50_us", floor: percentile(rawHandover, 50)),
            BenchResult(name: "preemption_to_connected_signal_thread_p99_us", value: percentile(preemptionOnSignalThread.up, 99), unit: "us", floorName: "raw_flock_handover_connect_p99_us", floor: percentile(rawHandover, 99)),
            BenchResult(name: "preemption_to_connected_signal_thread_state_seen_p50_us", value: percentile(preemptionOnSignalThread.observed, 50), unit: "us", floorName: "raw_flock_handover_connect_p50_us", floor: percentile(rawHandover, 50)),
            BenchResult(name: "preemption_to_connected_signal_thread_state_seen_p99_us", value: percentile(preemptionOnSignalThread.observed, 99), unit: "us", floorName: "raw_flock_handover_connect_p99_us", floor: percentile(rawHandover, 99)),
        ] + (single.map { single in
            [50.0, 99.0].flatMap { p -> [BenchResult] in
                let tag = "p\(Int(p))"
                let floor = percentile(single.raw, p)
                return [
                    BenchResult(name: "preemption_to_connected_one_processor_\(tag)_us", value: percentile(single.global.samples.up, p), unit: "us", floorName: "raw_flock_handover_connect_one_processor_\(tag)_us", floor: floor),
                    BenchResult(name: "preemption_to_connected_signal_thread_one_processor_\(tag)_us", value: percentile(single.signalThread.samples.up, p), unit: "us", floorName: "raw_flock_handover_connect_one_processor_\(tag)_us", floor: floor),
                ]
            }
        } ?? [])
        return (results, [
            "method": "\(rounds) drops and \(handovers) hand-overs of each kind after warm-up, loopback TCP, server and supervisor in one process; the preempted holder is a separate process; the preempting process keeps one Role for all its hand-overs and starts a new supervisor for each; the raw floor and the two supervised hand-overs (each with its own worker and role) run in alternating blocks of \(Self.handOverBlock) sampled rounds (after \(Self.handOverBlockWarmUp) unsampled ones), so that each figure and its floor see the same state of the machine",
            "end_point": "preemption_to_connected: from the preempting process's start of its supervisor (on the thread it runs on: the signal thread for ..._signal_thread) until its connect closure returns the new connection (connected, HELLO written: where the raw floor stops its clock); ..._state_seen: until the bench's task, a states() subscriber, sees .connected (one more hand-off between tasks, which the floor does not make)",
            "permit": "preemption uses roles (RolePermit: main preempts executor); preemption_to_connected: both supervisors on Swift's global executor; ..._signal_thread: both run under withTaskExecutorPreference(container.signals.executor) (connect() itself runs on the global executor: under the preference each attempt is an ordinary unstructured task; without one it starts immediately on the supervisor's own thread, Task.immediate)",
            "server_thread": "the loopback server's thread is SCHED_BATCH (Linux): it stands in for a server on another machine; its wake-ups (a connection accepted, read or closed) wait for a free processor or the next tick instead of preempting a measured thread. No end point waits for it: a loopback connect completes in the kernel, and the HELLO is written to the socket's buffer",
            "cores": "\(sysconf(Int32(_SC_NPROCESSORS_ONLN)))",
            "one_processor": single == nil
                ? "not measured: this process could not be pinned to one processor (Linux only)"
                : "the raw floor and both supervised hand-overs again, with the bench process (its server, its signal thread, every thread) and new workers pinned to one processor, in alternating blocks as above (\(max(handovers / 4, handOverBlock)) sampled hand-overs of each kind): the raw floor's processes take turns on one processor of their own accord (its pipe byte and its flock wake the next process where the last one runs), while a supervised hand-over's threads (each process's signal thread and pool threads, woken by futex) are spread over the processors by the scheduler, and a wake-up that lands on an idle processor can cost tens of µs (30-40 µs on the 2-core virtual machine of BENCHMARKS.md). These rows measure the hand-over's own work, context switches included, with that placement taken out; the plain rows are the ones the targets are for",
            "server_observed_overlaps": "\(global.count) of \(global.handOvers) hand-overs (global executor) and \(signalThread.count) of \(signalThread.handOvers) (signal thread), warm-up rounds included: the server saw the new holder's connection before the end of the old one's, although the old one's shutdown(2) returned before its role was released (each core's loopback packets go through that core's own backlog, so a FIN and the other core's SYN can reach the server in either order)",
        ])
    }

    /// Rounds of one kind of hand-over before the bench switches to the next kind.
    static let handOverBlock = 20
    /// Unsampled rounds at the start of each block.
    static let handOverBlockWarmUp = 3

    /// The raw floor and the two supervised hand-overs, measured in alternating blocks of
    /// ``handOverBlock`` sampled rounds (each after ``handOverBlockWarmUp`` unsampled ones),
    /// after a warm-up of a tenth of `rounds` each (this machine runs a process at one speed for
    /// a second or more, then much slower: measured one after the other, the floor of a run
    /// ranged 36-113 µs between consecutive runs).
    /// - Parameter tag: Appended to the roles' names and the connections' names at the server, so
    ///   that a second measurement in the same run has roles and server records of its own.
    private static func measureHandOvers(container: SharedContainer, path: String, server: LoopbackServer, rounds: Int, tag: String = "") async throws
        -> HandOvers {
        server.dropAll()
        let raw = try RawHandOver(path: path, server: server)
        let global = try Preemption(container: container, path: path, server: server, onSignalThread: false, tag: tag)
        let signalThread = try Preemption(container: container, path: path, server: server, onSignalThread: true, tag: tag)
        defer {
            raw.finish()
            global.finish()
            signalThread.finish()
        }
        // Warm-up: every kind once, unsampled.
        _ = try raw.measure(rounds / 10)
        _ = try await global.measure(rounds / 10)
        _ = try await signalThread.measure(rounds / 10)
        var rawSamples: [Double] = [], globalSamples = Preemption.Samples(), signalSamples = Preemption.Samples()
        var done = 0
        while done < rounds {
            // Each block starts with unsampled rounds, so that no kind's figures include the
            // first rounds after the other kinds ran (its processes asleep meanwhile).
            let block = min(handOverBlock, rounds - done)
            rawSamples += try raw.measure(handOverBlockWarmUp + block).dropFirst(handOverBlockWarmUp)
            globalSamples += try await global.measure(handOverBlockWarmUp + block).dropFirst(handOverBlockWarmUp)
            signalSamples += try await signalThread.measure(handOverBlockWarmUp + block).dropFirst(handOverBlockWarmUp)
            done += block
        }
        try raw.checkEveryRoundPreempted()
        return (rawSamples, (globalSamples, try global.overlaps()), (signalSamples, try signalThread.overlaps()))
    }

    /// What ``measureHandOvers(container:path:server:rounds:tag:)`` measured.
    private typealias HandOvers = (raw: [Double], global: (samples: Preemption.Samples, overlaps: Preemption.Overlaps), signalThread: (samples: Preemption.Samples, overlaps: Preemption.Overlaps))

    /// ``measureHandOvers(container:path:server:rounds:tag:)`` with every thread of this process
    /// pinned to the processor it runs on, and new workers (which inherit the pin); `nil` where
    /// the process cannot be pinned (not Linux). The pin is undone before this returns.
    private static func measureHandOversOnOneProcessor(container: SharedContainer, path: String, server: LoopbackServer, rounds: Int) async throws -> HandOvers? {
        try await onOneProcessor {
            try await measureHandOvers(container: container, path: path, server: server, rounds: rounds, tag: "-one-processor")
        }
    }

    /// Runs `body`, failing the benchmark instead of hanging if it takes over two minutes.
    private static func withTimeout<R: Sendable>(_ what: String, _ body: @escaping @Sendable () async throws -> R) async throws -> R {
        try await withThrowingTaskGroup(of: R?.self) { group in
            group.addTask { try await body() }
            group.addTask {
                try await Task.sleep(for: .seconds(120))
                return nil
            }
            defer { group.cancelAll() }
            guard let result = try await group.next() ?? nil else {
                throw BatonError(.timedOut, "\(what) did not finish within two minutes")
            }
            return result
        }
    }

    // MARK: Floors

    private static func measureRawConnect(port: UInt16, rounds: Int) throws -> [Double] {
        var samples: [Double] = []
        for index in 0..<(rounds + rounds / 10) {
            let start = monotonicNanoseconds()
            let fd = try LoopbackSocket.connected(port: port)
            let end = monotonicNanoseconds()
            close(fd)
            if index >= rounds / 10 { samples.append(Double(end - start) / 1_000) }
        }
        return samples
    }

    /// A blocking client on its own thread: `recv` returns 0 after the drop, it connects again
    /// at once and stamps the time.
    private static func measureRawReconnect(server: LoopbackServer, rounds: Int) throws -> [Double] {
        let port = server.port
        try waitForAllClosed(server)
        let stamps = Mutex<[UInt64]>([])
        let connected = DispatchSemaphore(value: 0)
        let stop = Mutex(false)
        let failure = Mutex<String?>(nil)
        let thread = Thread {
            var fd: Int32 = -1
            do { fd = try LoopbackSocket.connected(port: port) } catch { failure.withLock { $0 = "\(error)" } }
            connected.signal()
            var byte: UInt8 = 0
            while fd >= 0 {
                _ = recv(fd, &byte, 1, 0)
                close(fd)
                if stop.withLock({ $0 }) { return }
                do {
                    fd = try LoopbackSocket.connected(port: port)
                } catch {
                    failure.withLock { $0 = "\(error)" }
                    fd = -1
                }
                let now = monotonicNanoseconds()
                stamps.withLock { $0.append(now) }
                connected.signal()
            }
        }
        thread.start()
        /// Waits for the client thread, failing instead of hanging.
        func awaitClient() throws {
            guard connected.wait(timeout: .now() + 10) == .success else {
                throw BatonError(.timedOut, "the raw client did not reconnect within 10 s")
            }
            if let message = failure.withLock({ $0 }) {
                throw BatonError(.systemCallFailed, "the raw client could not reconnect: \(message)")
            }
        }
        try awaitClient()
        /// Waits up to `seconds` for the client's reconnection number `count + 1`.
        func reconnected(after count: Int, within seconds: Double) throws -> Bool {
            let deadline = DispatchTime.now() + seconds
            while stamps.withLock({ $0.count }) <= count {
                guard connected.wait(timeout: deadline) == .success else { return false }
            }
            if let message = failure.withLock({ $0 }) {
                throw BatonError(.systemCallFailed, "the raw client could not reconnect: \(message)")
            }
            return true
        }
        var samples: [Double] = []
        for index in 0..<(rounds + rounds / 10) {
            try waitForOpen(server)
            let before = stamps.withLock { $0.count }
            let start = monotonicNanoseconds()
            server.dropAll()
            // The open connection the server saw may have been a late one of an earlier floor
            // (a connect the server accepted after that floor's client had closed it), not this
            // client's: then nothing reached the client. Such a round is dropped again and not
            // sampled; a reconnection it may cause twice lands before the next round starts.
            var disturbed = false
            while try !reconnected(after: before, within: 1) {
                guard monotonicNanoseconds() - start < 10_000_000_000 else {
                    throw BatonError(.timedOut, "the raw client did not reconnect within 10 s")
                }
                disturbed = true
                try waitForOpen(server)
                server.dropAll()
            }
            let end = stamps.withLock { $0[before] }
            if disturbed { usleep(200_000) }
            if index >= rounds / 10, !disturbed { samples.append(Double(end - start) / 1_000) }
        }
        try waitForOpen(server)
        stop.withLock { $0 = true }
        server.dropAll()
        return samples
    }

    /// Sleeps in the kernel until the server has no open connection.
    private static func waitForAllClosed(_ server: LoopbackServer) throws {
        guard server.waitForOpenConnections(timeout: .seconds(5), until: \.isEmpty) else {
            throw BatonError(.timedOut, "the server still has open connections")
        }
    }

    /// Sleeps in the kernel until the server has an open connection.
    private static func waitForOpen(_ server: LoopbackServer) throws {
        guard server.waitForOpenConnection(timeout: .seconds(5)) else {
            throw BatonError(.timedOut, "the server saw no connection within 5 s")
        }
    }

    // MARK: Supervisor

    private static func measureSupervisedReconnect(server: LoopbackServer, rounds: Int) async throws -> [Double] {
        let port = server.port
        try waitForAllClosed(server)
        let supervisor = ConnectionSupervisor(
            configuration: .init(backoff: ConnectionBackoff(stablePeriod: .zero), keepAliveInterval: nil)
        ) { try LoopbackClient(port: port) }
        var states = supervisor.states().makeAsyncIterator()
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await supervisor.run() }
            defer { group.cancelAll() }
            while let state = await states.next(), !state.isConnected {}
            var samples: [Double] = []
            for index in 0..<(rounds + rounds / 10) {
                try waitForOpen(server)
                let start = monotonicNanoseconds()
                server.dropAll()
                while let state = await states.next(), !state.isConnected {}
                let end = monotonicNanoseconds()
                if index >= rounds / 10 { samples.append(Double(end - start) / 1_000) }
            }
            return samples
        }
    }

    /// Preemptions of a worker process that holds a role and a connection, by this process (at
    /// a higher priority), each until this process's new supervisor reports its connection up.
    /// Each measurement has its own role and its own names at the server, so both run beside
    /// the raw floor's worker.
    private final class Preemption {
        let container: SharedContainer
        let server: LoopbackServer
        let worker: WorkerProcess
        /// Both supervisors run on their process's signal thread
        /// (`withTaskExecutorPreference(container.signals.executor)`, the low-latency setup the
        /// README gives for roles), instead of Swift's global executor; their connect attempts
        /// still run on the global executor.
        let executor: (any TaskExecutor)?
        /// One role for every round, as an app keeps its `Role` (a new one per round would add
        /// its first acquisition's setup to each hand-over: the signal observation, the file
        /// watch, the epoch floor's read); a new supervisor per round, which starts from nothing.
        let role: Role
        /// The names this process's and the worker's connections give the server.
        let appName: String, holderName: String
        /// The worker's connections that the rounds preempted: each round starts at the
        /// worker's next one (``HolderConnections``).
        let holder = HolderConnections()

        init(container: SharedContainer, path: String, server: LoopbackServer, onSignalThread: Bool, tag: String) throws {
            let suffix = (onSignalThread ? "-signal-thread" : "") + tag
            self.container = container
            self.server = server
            appName = "app" + suffix
            holderName = "executor" + suffix
            worker = try WorkerProcess(suite: LifecycleBench.name, container: path,
                                       arguments: ["supervise", "\(server.port)", "bench" + suffix, holderName] + (onSignalThread ? ["signal-thread"] : []))
            executor = onSignalThread ? try container.signals.executor : nil
            role = try Role(container, name: "bench" + suffix)
            try worker.waitReady()
        }

        /// Each hand-over's times in µs: until the new connection is up (this process's
        /// `connect` closure returns it: connected and HELLO written, the point where the raw
        /// floor stops its clock), and until a `states()` subscriber (the bench's task) sees
        /// ``ConnectionState/connected(since:)``.
        struct Samples {
            var up: [Double] = []
            var observed: [Double] = []

            func dropFirst(_ count: Int) -> Samples {
                Samples(up: Array(up.dropFirst(count)), observed: Array(observed.dropFirst(count)))
            }

            static func += (left: inout Samples, right: Samples) {
                left.up += right.up
                left.observed += right.observed
            }
        }

        /// `count` hand-overs.
        func measure(_ count: Int) async throws -> Samples {
            let port = server.port
            let hello = LoopbackClient.Hello(name: appName)
            var samples = Samples()
            for _ in 0..<count {
                let preempting = try holder.waitForNext(server, name: holderName)
                // When this round's connection came up: stamped by the connect closure itself,
                // once (a later reconnection of the same round would not move it).
                let upAt = Atomic<UInt64>(0)
                let supervisor = ConnectionSupervisor(
                    container: container,
                    permit: RolePermit(role, priority: .main, kind: "app"),
                    configuration: .init(keepAliveInterval: nil)
                ) {
                    let client = try LoopbackClient(port: port, hello: hello)
                    _ = upAt.compareExchange(expected: 0, desired: monotonicNanoseconds(), ordering: .relaxed)
                    return client
                }
                var states = supervisor.states().makeAsyncIterator()
                try await withTaskExecutorPreference(executor) {
                    // The clock starts on the thread that starts the supervisor: a process whose
                    // role code runs on the signal thread is on it already (the hop to it from
                    // the bench's own task, 6-8 µs in traces, is the bench's, not the hand-over's).
                    handOverTrace("bench.start")
                    let start = monotonicNanoseconds()
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        // Started immediately, as a process that must take over starts it: its
                        // acquisition runs on this thread until it first waits (an ordinary child
                        // task would add a hand-off to another thread to every hand-over).
                        if #available(macOS 26, iOS 26, watchOS 26, tvOS 26, visionOS 26, *) {
                            group.addImmediateTask { try await supervisor.run() }
                        } else {
                            group.addTask { try await supervisor.run() }
                        }
                        while let state = await states.next(), !state.isConnected {}
                        let end = monotonicNanoseconds()
                        handOverTrace("bench.connected")
                        let up = upAt.load(ordering: .relaxed)
                        guard up >= start else {
                            throw BatonError(.corrupt, "the supervisor reported connected before its connect closure returned a connection")
                        }
                        samples.up.append(Double(up - start) / 1_000)
                        samples.observed.append(Double(end - start) / 1_000)
                        group.cancelAll()
                        try await group.waitForAll()
                    }
                }
                holder.preempted(preempting)
            }
            // The worker has the role and its connection back before another kind is measured.
            _ = try holder.waitForNext(server, name: holderName)
            return samples
        }

        /// How many of this measurement's hand-overs the server saw, and how many of them overlap.
        struct Overlaps {
            var count: Int
            var handOvers: Int
        }

        /// How many hand-overs the server saw overlap.
        ///
        /// The server's order of events is when its poll thread saw them: a FIN can reach it
        /// after the next holder's SYN (each core's loopback packets go through that core's own
        /// backlog), so an overlap seen there is counted and reported, not taken for two holders
        /// at once unless it happens in more than a tenth of the rounds. (The hand-over order is
        /// asserted strictly, with real processes, by LifecycleTests' handOverScenario, which
        /// has no competing load.)
        func overlaps() throws -> Overlaps {
            let records = server.records.filter { $0.name == appName || $0.name == holderName }
            let rounds = records.filter { $0.name == appName }.count
            try holder.checkEveryRoundPreempted(records.filter { $0.name == holderName }, rounds: rounds, what: "the supervised worker \(holderName)")
            let overlaps = LoopbackServer.overlaps(records)
            if overlaps.count > max(1, rounds / 10) {
                throw BatonError(.corrupt, "two connections were open at once in \(overlaps.count) of \(rounds) hand-overs, as the server saw them: \(overlaps.prefix(3))")
            }
            return Overlaps(count: overlaps.count, handOvers: rounds)
        }

        /// Ends the worker (gone before another measurement starts a holder of its own). Safe
        /// to call again: a reaped worker is neither signalled nor waited for twice.
        func finish() {
            worker.kill()
            worker.wait()
        }
    }

    /// The floor: the same hand-over done raw. A pipe byte asks the worker, which closes its
    /// socket and `flock(LOCK_UN)`s; this process's blocking `flock` returns, then it connects
    /// and says its HELLO line, as the supervised client does.
    private final class RawHandOver {
        let server: LoopbackServer
        let worker: WorkerProcess
        let lockFD: Int32

        /// (A worker left behind by a throw is killed and reaped when its process object goes.)
        init(path: String, server: LoopbackServer) throws {
            self.server = server
            let lockPath = path + "/.baton/bench-raw-handover.lock"
            worker = try WorkerProcess(suite: LifecycleBench.name, container: path, arguments: ["raw-holder", "\(server.port)", lockPath])
            try worker.waitReady()
            lockFD = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            guard lockFD >= 0 else { throw BatonError(.systemCallFailed, "open \(lockPath) failed") }
        }

        deinit { if lockFD >= 0 { close(lockFD) } }

        /// The raw holder's connections, as ``Preemption/holder``.
        let holder = HolderConnections()

        /// `count` hand-overs; returns each one's time in µs.
        func measure(_ count: Int) throws -> [Double] {
            let hello = LoopbackLine.hello(name: "raw-app", pid: getpid(), epoch: 0).text
            var samples: [Double] = []
            for _ in 0..<count {
                // Each round starts as a supervised one does: once the server has seen the
                // holder's next connection (its HELLO read; see ``HolderConnections``), not
                // while the server's thread may still be awake with it (then the holder's
                // shutdown below would find that thread running, and spare the wake-up the
                // supervised rounds pay: 4 µs against 25 µs for the same shutdown(2), measured
                // with the trace points).
                let preempting = try holder.waitForNext(server, name: "raw-holder")
                handOverTrace("floor.start")
                let start = monotonicNanoseconds()
                worker.send("yield")
                handOverTrace("floor.asked")
                _ = flock(lockFD, LOCK_EX)
                handOverTrace("floor.locked")
                let fd = try LoopbackSocket.connected(port: server.port)
                LoopbackSocket.write(fd, hello)
                let end = monotonicNanoseconds()
                handOverTrace("floor.connected")
                samples.append(Double(end - start) / 1_000)
                close(fd)
                _ = flock(lockFD, LOCK_UN)
                // Only now may the holder lock again (otherwise it could take the lock back
                // before this side's flock, and both would wait for each other).
                worker.send("again")
                guard worker.receiveLine() == "ready" else { throw BatonError(.invalidArgument, "raw holder stopped") }
                holder.preempted(preempting)
            }
            // The server has the holder's next connection before another kind is measured.
            _ = try holder.waitForNext(server, name: "raw-holder")
            return samples
        }

        /// Throws unless every round preempted the raw holder (``HolderConnections``).
        func checkEveryRoundPreempted() throws {
            // Only this worker's (the measurement on one processor has a raw holder of its own).
            let records = server.records.filter { $0.name == "raw-holder" && $0.pid == worker.pid }
            try holder.checkEveryRoundPreempted(records, rounds: holder.rounds, what: "the raw holder")
        }

        /// Ends the worker; safe to call again, as ``Preemption/finish()``.
        func finish() {
            worker.kill()
            worker.wait()
        }
    }

    // MARK: Workers

    static func worker(arguments: [String], container path: String) async throws {
        let container = try SharedContainer(path: path)
        switch arguments.first {
        case "supervise":
            // supervise PORT ROLE NAME [signal-thread]
            let port = UInt16(arguments[1])!
            let hello = LoopbackClient.Hello(name: arguments[3])
            let supervisor = ConnectionSupervisor(
                container: container,
                permit: RolePermit(try Role(container, name: arguments[2]), priority: .executor, kind: "extension"),
                configuration: .init(keepAliveInterval: nil)
            ) { try LoopbackClient(port: port, hello: hello) }
            var states = supervisor.states().makeAsyncIterator()
            let executor: (any TaskExecutor)? = arguments.dropFirst(4).first == "signal-thread" ? try container.signals.executor : nil
            try await withTaskExecutorPreference(executor) {
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask { try await supervisor.run() }
                    while let state = await states.next(), !state.isConnected {}
                    emit("ready")
                    try await group.next()
                }
            }
        case "raw-holder":
            let port = UInt16(arguments[1])!
            let lockFD = open(arguments[2], O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            while true {
                _ = flock(lockFD, LOCK_EX)
                let fd = try LoopbackSocket.connected(port: port)
                LoopbackSocket.write(fd, LoopbackLine.hello(name: "raw-holder", pid: getpid(), epoch: 0).text)
                emit("ready")
                guard readStandardInputLine() != nil else { return }
                handOverTrace("holder.asked")
                shutdown(fd, Int32(SHUT_RDWR))
                handOverTrace("holder.shutdown")
                close(fd)
                _ = flock(lockFD, LOCK_UN)
                handOverTrace("holder.unlocked")
                // The requester takes the lock, then says when it has let go again.
                guard readStandardInputLine() != nil else { return }
            }
        default:
            throw BatonError(.invalidArgument, "unknown lifecycle worker \(arguments)")
        }
    }
}

/// Which of a holder's connections (the server's ids) the rounds of a hand-over
/// measurement preempted, so that each round starts at the holder's *next* connection.
///
/// A round that started as soon as the server listed any open connection with the holder's
/// name could start before the holder was back: the server's thread may not yet have read
/// the end of the connection the last round preempted (on a loaded machine it waits for a
/// processor for milliseconds), and that connection still looks open. The new holder then
/// takes a role nobody holds, and the round measures an acquisition, not a hand-over: in a
/// loaded run of the trace build before this check, 84 of 628 rounds had no stop request at
/// all (their median: 92 µs against 264-303 µs). The holder's next connection is made under
/// its grant, so once the server lists it, the holder holds the role again.
package final class HolderConnections: Sendable {
    private let last = Atomic<Int>(-1)
    private let count = Atomic<Int>(0)

    package init() {}

    /// Waits (in the kernel, `timeout` at most) for an open connection named `name` that came
    /// after the one the last round preempted; returns its id.
    /// - Throws: `timedOut` when none is open by then.
    package func waitForNext(_ server: LoopbackServer, name: String, timeout: Duration = .seconds(5)) throws -> Int {
        let after = last.load(ordering: .relaxed)
        guard let id = server.waitForOpenConnection(named: name, after: after, timeout: timeout) else {
            throw BatonError(.timedOut, "the holder \(name) did not connect again within \(timeout) (its last preempted connection: \(after))")
        }
        return id
    }

    /// How many rounds started at one of the holder's connections.
    package var rounds: Int { count.load(ordering: .relaxed) }

    /// Notes that a round preempted the connection `id`.
    package func preempted(_ id: Int) {
        last.store(id, ordering: .relaxed)
        count.add(1, ordering: .relaxed)
    }

    /// Throws unless the holder made exactly one connection more than the rounds (its
    /// first, then one after each preemption) and this process started `rounds` rounds, each
    /// at a different one of them.
    package func checkEveryRoundPreempted(_ records: [LoopbackServer.Record], rounds: Int, what: String) throws {
        let preempted = count.load(ordering: .relaxed)
        guard preempted == rounds, records.count == rounds + 1 else {
            throw BatonError(.corrupt, "\(what) connected \(records.count) times in \(rounds) hand-overs (\(preempted) rounds started at one of its connections): every round must preempt it, and it connects once more after each")
        }
    }
}
