import Baton
import BatonLoopback
import BatonSimulator
import BatonSpawn
import Foundation
import BatonTestSupport
import Testing
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// The simulator and `baton demo`, with real processes: a seeded chaos run, the replayable fault
/// schedule, the 0xDEAD10CC rule and the extension's memory limit.
@Suite("Simulator", .serialized)
struct SimulatorTests {
    /// The lock reader behind every "no lock while suspended" check. `/proc/locks` names the
    /// process that took a lock, but an `flock` belongs to the open file description: a child
    /// spawned while it is held shares the description from its fork until it closes its copy
    /// (before its exec, or never when the descriptor is passed on), and the lock outlives this
    /// process's `close` under this process's pid. With other threads spawning children (as
    /// the suites running beside a test do), 52 of 3,000 releases were still listed right
    /// after the `close`. Here the child keeps its copy, so the case is certain.
    @Test("a released flock is not counted as held while a child still shares its open file description")
    func releasedLockIsNotHeldThroughAChildsCopy() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/locked"
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        try #require(fd >= 0)
        var info = stat()
        try #require(fstat(fd, &info) == 0 && flock(fd, LOCK_EX) == 0)
        #expect(ProcLocks.held(by: getpid(), under: directory.path).count == 1)
        var spawn = ChildSpawn("/bin/sleep", ["60"])
        spawn.standardInput = .null
        spawn.descriptors = [3: fd]
        let child = try spawn.spawn()
        defer {
            child.signal(SIGKILL)
            _ = child.wait()
        }
        close(fd)
        #expect(ProcFS.locks().contains { $0.inode == UInt64(info.st_ino) && $0.pid == getpid() && !$0.waiting },
                "/proc/locks still names this process: the case the reader has to tell apart")
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty, "released by this process, held only through the child's copy")
        // The lock is really still there: another description cannot take it.
        let other = open(path, O_RDWR | O_CLOEXEC)
        defer { close(other) }
        #expect(flock(other, LOCK_EX | LOCK_NB) != 0)
    }

    static func object(_ line: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] ?? [:]
    }

    /// Runs `baton demo --json` and returns its exit status and JSON report.
    static func demo(_ arguments: [String]) async throws -> (status: Int32, report: [String: Any]) {
        // The run's events, said when it fails: what happened to each message it names.
        let events = FileManager.default.temporaryDirectory.appendingPathComponent("baton-demo-events-\(UUID().uuidString).jsonl").path
        defer { try? FileManager.default.removeItem(atPath: events) }
        let result = try await runBaton(["demo", "--json", "--events", events] + arguments, container: nil, timeout: 90)
        // Without a report, what the run and its processes said (progress lines left out).
        let line = try #require(result.lines.last { $0.hasPrefix("{") }, "no JSON report; stderr: \(result.errors.filter { !$0.hasPrefix("t=") }.suffix(12))")
        let report = object(line)
        if result.status != 0 {
            let failures = "\(report["failures"] ?? "")"
            let named = Set(failures.matches(of: /[a-z0-9]+-m[0-9]{4}/).map { String($0.output) })
            let lines = ((try? String(contentsOfFile: events, encoding: .utf8)) ?? "").split(separator: "\n")
            let relevant = lines.filter { line in named.contains { line.contains($0) } || line.contains("\"process\":\"app") }
            print("demo \(arguments.joined(separator: " ")) failed: \(failures)\nits events for those messages and the app:\n\(relevant.suffix(80).joined(separator: "\n"))")
        }
        return (result.status, report)
    }

    /// The same seeded chaos run under Apple's rule (the default) and the strict one: both keep
    /// every invariant, and the fault schedule replays.
    @Test func seededChaosRunKeepsEveryInvariantUnderBothRulesAndReplaysItsFaults() async throws {
        let arguments = ["--chaos", "--seed", "42", "--seconds", "12", "--messages", "30"]
        let first = try await Self.demo(arguments)
        let second = try await Self.demo(arguments + ["--rule", "strict"])
        #expect(first.report["dead10cc_rule"] as? String == "apple")
        #expect(second.report["dead10cc_rule"] as? String == "strict")
        for run in [first, second] {
            let report = run.report
            #expect(run.status == 0, "invariants failed: \(report["failures"] ?? "?")")
            #expect(report["sent"] as? Int == 30)
            #expect(report["stored"] as? Int == 30)
            // A message whose claim for display committed in a process killed before its `shown`
            // event is counted apart (iOS shows such a push with its original content).
            #expect((report["shown"] as? Int ?? 0) + (report["claimed_by_killed_process"] as? Int ?? 0) == 30)
            #expect(report["lost"] as? Int == 0)
            #expect(report["shown_twice"] as? Int == 0)
            #expect(report["overlapping_connections"] as? Int == 0)
            #expect(report["dead10cc_kills"] as? Int == 0)
            #expect((report["faults_injected"] as? Int ?? 0) > 0)
            #expect((report["extension_peak_dirty_mib"] as? Double ?? 99) < 24)
            #expect((report["extension_peak_rss_mib"] as? Double ?? 0) > 0)
            #expect(report["memory_limit_kills"] as? Int == 0)
            let latency = report["send_to_shown_ms"] as? [String: Any]
            #expect(latency?["p50"] is Double)
            #expect(latency?["p99"] is Double)
            #expect(report["handovers"] is Int)
        }
        let schedule = first.report["fault_schedule"] as? [String] ?? []
        #expect(!schedule.isEmpty)
        #expect(schedule == second.report["fault_schedule"] as? [String])
    }

    /// The failure CI met once (`--rule strict`, 29 of 30 shown): an extension claimed a message
    /// for display, and the chaos schedule's SIGKILL came before it said so. The store's claim,
    /// with the claimant's pid, tells that apart from a message nobody claimed.
    @Test func aClaimByAProcessKilledBeforeItReportedIsNotALoss() {
        let events = [
            SimulatorEvent(kind: .sent, process: "server", pid: 0, message: "m1", time: 1),
            SimulatorEvent(kind: .sent, process: "server", pid: 0, message: "m2", time: 2),
            SimulatorEvent(kind: .sent, process: "server", pid: 0, message: "m3", time: 3),
            SimulatorEvent(kind: .shown, process: "app#1", pid: 10, message: "m1", time: 4),
            SimulatorEvent(kind: .killed, process: "extension#1", pid: 42, time: 5),
        ]
        var report = DemoReport()
        // m2: claimed by the killed extension; m3: claimed by a process that was not killed.
        report.tally(events, claims: ["m1": 10, "m2": 42, "m3": 43])
        #expect(report.shown == 1)
        #expect(report.claimedByKilledProcess == ["m2"])
        #expect(report.lost == ["m3"])
        #expect(report.failures.contains { $0.contains("never shown: m3") })
        var withoutClaims = DemoReport()
        withoutClaims.tally(events)
        #expect(withoutClaims.lost == ["m2", "m3"])
    }

    @Test func faultPlansDependOnlyOnTheSeed() {
        let a = FaultPlan.random(seed: 9, window: 1...20)
        let b = FaultPlan.random(seed: 9, window: 1...20)
        let c = FaultPlan.random(seed: 10, window: 1...20)
        #expect(!a.faults.isEmpty)
        #expect(a == b)
        #expect(a != c)
        #expect(a.faults.allSatisfy { (1...20).contains($0.at) })
    }

    /// Runs `body` with a simulator and its server, both running until `body` returns.
    static func withSimulator(
        configure: (inout Simulator.Configuration) -> Void = { _ in },
        _ body: @Sendable (Simulator, String) async throws -> Void
    ) async throws {
        let directory = try TemporaryContainer()
        let timeline = Timeline()
        let server = try LoopbackServer(timeline: timeline) { _ in }
        var configuration = Simulator.Configuration(executable: ChildProcess.executable, container: directory.path, serverPort: server.port)
        configuration.suspensionGrace = .seconds(3)
        configure(&configuration)
        let simulator = Simulator(configuration: configuration, timeline: timeline)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await server.run() }
            group.addTask { await simulator.run() }
            defer { group.cancelAll() }
            do {
                try await body(simulator, directory.path)
            } catch {
                await simulator.shutdown()
                throw error
            }
            await simulator.shutdown()
        }
    }

    /// Chaos may kill the app while it launches (a fault due just before an open, run late on a
    /// loaded machine). That leaves the app not running, as on iOS, and is no failed simulation:
    /// the open returns (the next one launches the app again). The open used to wait for the dead
    /// process's `ready` for 20 s and then fail the run. The app here is a program that never
    /// reports ready, so the kill always comes first.
    @Test func anAppKilledWhileItLaunchesIsLeftNotRunning() async throws {
        try await Self.withSimulator(configure: { $0.appProgram = Simulator.Program(command: ["/bin/sleep", "60"]) }) { simulator, _ in
            let launched = simulator.expect { $0.kind == .launched && $0.process.hasPrefix("app") }
            async let opened: Void = simulator.foregroundApp()
            let launch = try #require(await simulator.wait(for: launched, timeout: .seconds(20)))
            await simulator.terminateApp()
            try await opened
            #expect(simulator.appPhase == .notRunning)
            #expect(simulator.app == nil)
            #expect(simulator.timeline.events.contains { $0.kind == .killed && $0.pid == launch.pid })
        }
    }

    @Test func aSuspendedProcessHoldingAContainerLockIsKilled() async throws {
        try await Self.withSimulator(configure: { $0.appArguments = ["--keep-locks-when-suspended"] }) { simulator, directory in
            let acquired = simulator.expect { $0.kind == .roleAcquired }
            try await simulator.foregroundApp()
            _ = try #require(await simulator.wait(for: acquired, timeout: .seconds(20)))
            let app = try #require(simulator.app)
            #expect(!ProcFS.locksHeld(by: app.pid, under: directory).isEmpty)
            #expect(ProcFS.lockedFiles(of: app.pid, under: directory).contains { $0.hasPrefix(".baton/presence/") })
            let killed = await simulator.suspendApp()
            #expect(killed)
            #expect(simulator.deadLockKills == 1)
            #expect(simulator.timeline.events.contains { $0.kind == .dead10cc && $0.pid == app.pid })
            let gone = simulator.expect { $0.pid == app.pid && $0.kind == .killed }
            if app.isRunning { _ = await simulator.wait(for: gone, timeout: .seconds(10)) }
            #expect(app.exitStatus == 128 + SIGKILL)
        }
    }

    /// Under the strict rule the app holds no lock at all when suspended (its database closes
    /// every connection); under Apple's rule its idle WAL connections stay open, holding only
    /// the shared locks TN2408 allows (the `-shm` dead-man's-switch byte, the database's
    /// SHARED range), and nothing on any other file.
    @Test(arguments: DeadLockRule.allCases)
    func aWellBehavedAppReleasesEveryForbiddenLockBeforeSuspension(rule: DeadLockRule) async throws {
        try await Self.withSimulator(configure: { $0.rule = rule }) { simulator, directory in
            let acquired = simulator.expect { $0.kind == .roleAcquired }
            try await simulator.foregroundApp()
            _ = try #require(await simulator.wait(for: acquired, timeout: .seconds(20)))
            let app = try #require(simulator.app)
            let killed = await simulator.suspendApp()
            #expect(!killed)
            #expect(app.isRunning && app.isStopped)
            let held = ProcFS.heldLocks(of: app.pid, under: directory)
            #expect(rule.violations(held) { ProcFS.header(of: directory + "/" + $0) }.isEmpty, "\(held)")
            switch rule {
            case .strict:
                #expect(held.isEmpty, "\(held)")
                #expect(ProcFS.lockedFiles(of: app.pid, under: directory).isEmpty)
            case .apple:
                #expect(held.allSatisfy { !$0.exclusive && $0.path.hasPrefix("baton-inbox.sqlite") }, "\(held)")
            }
            #expect(simulator.deadLockKills == 0)
            let reacquired = simulator.expect { $0.kind == .roleAcquired && $0.pid == app.pid }
            simulator.resumeApp()
            #expect(await simulator.wait(for: reacquired, timeout: .seconds(20)) != nil)
        }
    }

    @Test func anExtensionPastTheTimeLimitIsKilled() async throws {
        try await Self.withSimulator(configure: { $0.extensionTimeLimit = .seconds(1) }) { simulator, _ in
            // A push for a message the server never sends: the instance waits for it, past the limit.
            let limit = simulator.expect { $0.kind == .limit }
            simulator.push("never-sent")
            let event = try #require(await simulator.wait(for: limit, timeout: .seconds(20)))
            #expect(event.detail?.contains("longer than") == true)
            #expect(simulator.limitKills["time"] == 1)
        }
    }

    @Test func anExtensionPastTheMemoryLimitIsKilled() async throws {
        try await Self.withSimulator(configure: {
            $0.extensionMemoryLimit = 24 << 20
            $0.memoryMeasure = .dirty
        }) { simulator, _ in
            let ready = simulator.expect { $0.kind == .ready }
            let process = try simulator.launchExtension()
            _ = try #require(await simulator.wait(for: ready, timeout: .seconds(20)))
            let limit = simulator.expect { $0.kind == .limit && $0.pid == process.pid }
            let gone = simulator.expect { $0.kind == .killed && $0.pid == process.pid }
            process.send(ChildCommand(.allocate, mebibytes: 40))
            let event = try #require(await simulator.wait(for: limit, timeout: .seconds(20)))
            #expect(event.detail?.contains("dirty memory") == true)
            _ = await simulator.wait(for: gone, timeout: .seconds(10))
            #expect(process.exitStatus == 128 + SIGKILL)
            #expect(simulator.limitKills["memory"] == 1)
        }
    }
}
