import Baton
import BatonSimulator
import BatonTestSupport
import Foundation
import Synchronization
import Testing
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// Apple's 0xDEAD10CC rule (TN2408), decided from lock byte ranges, on real processes: each
/// clause kills the program that breaks it, and WAL readers and Baton's suspension are allowed.
@Suite("0xDEAD10CC rule", .serialized)
struct DeadLockRuleTests {
    static let walHeader = Array("SQLite format 3".utf8) + [0] + [0x10, 0, 2, 2] + Array(repeating: 0, count: 80)
    static let deleteHeader = Array("SQLite format 3".utf8) + [0] + [0x10, 0, 1, 1] + Array(repeating: 0, count: 80)

    static func clauses(_ lock: ProcFS.HeldLock, header: [UInt8]?) -> [DeadLockRule.Clause] {
        DeadLockRule.apple.violations([lock]) { _ in header }.map(\.clause)
    }

    @Test func theRuleDecidesEachClauseFromByteRanges() {
        let pending: UInt64 = 0x4000_0000
        // (a) a plain file.
        #expect(Self.clauses(.init(path: "plain.lock", kind: "FLOCK", exclusive: true), header: Array("hello".utf8)) == [.notADatabase])
        // (b) rollback journal, and an unrecognised (encrypted) header.
        #expect(Self.clauses(.init(path: "a.sqlite", kind: "POSIX", exclusive: false, start: pending + 2, end: pending + 511), header: Self.deleteHeader) == [.rollbackOrUnrecognised])
        #expect(Self.clauses(.init(path: "a.sqlite", kind: "POSIX", exclusive: false, start: pending + 2, end: pending + 511), header: Array(repeating: 0xA5, count: 100)) == [.rollbackOrUnrecognised])
        // (c) WAL: RESERVED, PENDING, EXCLUSIVE on the database, the write lock (120) on -shm.
        #expect(Self.clauses(.init(path: "a.sqlite", kind: "POSIX", exclusive: true, start: pending + 1, end: pending + 1), header: Self.walHeader) == [.walWriteTransaction])
        #expect(Self.clauses(.init(path: "a.sqlite", kind: "POSIX", exclusive: false, start: pending, end: pending), header: Self.walHeader) == [.walWriteTransaction])
        #expect(Self.clauses(.init(path: "a.sqlite", kind: "POSIX", exclusive: true, start: pending + 2, end: pending + 511), header: Self.walHeader) == [.walWriteTransaction])
        #expect(Self.clauses(.init(path: "a.sqlite-shm", kind: "POSIX", exclusive: true, start: 120, end: 120), header: Self.walHeader) == [.walWriteTransaction])
        // Allowed: WAL readers (SHARED range read lock, read marks 123-127), checkpoint, DMS (128).
        #expect(Self.clauses(.init(path: "a.sqlite", kind: "POSIX", exclusive: false, start: pending + 2, end: pending + 511), header: Self.walHeader).isEmpty)
        #expect(Self.clauses(.init(path: "a.sqlite-shm", kind: "POSIX", exclusive: false, start: 123, end: 128), header: Self.walHeader).isEmpty)
        #expect(Self.clauses(.init(path: "a.sqlite-shm", kind: "POSIX", exclusive: true, start: 121, end: 121), header: Self.walHeader).isEmpty)
        // Strict: anything.
        #expect(DeadLockRule.strict.violations([.init(path: "a.sqlite-shm", kind: "POSIX", exclusive: false, start: 128, end: 128)]) { _ in Self.walHeader }.map(\.clause) == [.anyLock])
    }

    /// Launches `baton MODE ARGUMENTS`, waits until it is ready, runs `prepare`, suspends it.
    /// - Returns: The kill, if the rule killed it.
    static func suspendWorker(_ mode: String, _ arguments: [String], prepare: @Sendable (SimulatedProcess, String) async throws -> Void = { _, _ in }) async throws -> DeadLockKill? {
        let result = Mutex<DeadLockKill?>(nil)
        // The lock holders are test workers: they run in `baton-harness`, not `baton`.
        try await SimulatorTests.withSimulator(configure: { $0.executable = ChildProcess.harnessExecutable }) { simulator, directory in
            let ready = simulator.expect { $0.kind == .ready }
            let process = try simulator.launch(label: "worker", mode: mode, arguments: arguments)
            _ = try #require(await simulator.wait(for: ready, timeout: .seconds(20)), "\(mode) \(arguments) never reported ready")
            try await prepare(process, directory)
            let killed = await simulator.suspend(process)
            #expect(killed == !simulator.deadLockKillRecords.isEmpty)
            if !killed {
                #expect(process.isRunning && process.isStopped)
                simulator.resume(process)
            }
            result.withLock { $0 = simulator.deadLockKillRecords.first }
        }
        return result.withLock { $0 }
    }

    @Test(arguments: [
        ("flock", DeadLockRule.Clause.notADatabase, "plain.lock"),
        ("delete-db", .rollbackOrUnrecognised, "delete.sqlite"),
        ("unrecognised", .rollbackOrUnrecognised, "encrypted.sqlite"),
        ("wal-write", .walWriteTransaction, "wal.sqlite-shm"),
    ])
    func aProgramHoldingAForbiddenLockIsKilledWithItsClause(hold: String, clause: DeadLockRule.Clause, file: String) async throws {
        let kill = try #require(try await Self.suspendWorker("sim-lock-holder", ["--hold", hold]), "\(hold) was not killed")
        #expect(kill.rule == .apple)
        #expect(kill.violations.contains { $0.clause == clause && $0.lock.path == file }, "\(kill)")
        #expect(Set(kill.violations.map(\.clause)) == [clause], "\(kill)")
    }

    @Test func aProgramHoldingOnlyWALReadLocksIsSuspended() async throws {
        let kill = try await Self.suspendWorker("sim-lock-holder", ["--hold", "wal-read"])
        #expect(kill == nil, "\(kill.map(String.init(describing:)) ?? "")")
    }

    @Test(arguments: [false, true])
    func aGRDBAppWithAWriteOpenInTheBackgroundIsKilledUnlessItUsesBatonsSuspension(baton: Bool) async throws {
        let kill = try await Self.suspendWorker("sim-grdb-app", baton ? ["--baton"] : []) { process, directory in
            process.send(ChildCommand(.background))
            // The write has begun (it then runs for 30 s) once the worker holds the WAL write
            // lock (a fixed 400 ms sleep here could end before it, on a loaded runner).
            let start = ContinuousClock.now
            while !ProcFS.heldLocks(of: process.pid, under: directory).contains(where: { $0.path == "app.sqlite-shm" && $0.start == 120 && $0.exclusive }) {
                guard ContinuousClock.now - start < .seconds(30) else { throw TestFailure("the worker's write never began") }
                try await Task.sleep(for: .milliseconds(10))
            }
        }
        if baton {
            #expect(kill == nil, "\(kill.map(String.init(describing:)) ?? "")")
        } else {
            let kill = try #require(kill, "plain GRDB with an open write was not killed")
            #expect(kill.violations.contains { $0.clause == .walWriteTransaction && $0.lock.path == "app.sqlite-shm" && $0.lock.start == 120 }, "\(kill)")
        }
    }

    static var examples: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Examples/LifecycleProtocol").path
    }

    @Test func aPythonExtensionFollowsTheLifecycleProtocol() async throws {
        let directory = try TemporaryContainer()
        let scenario = try Scenario.load(Self.examples + "/scenario.json")
        let (report, timeline) = try await ScenarioRun(scenario: scenario, container: directory.path).run()
        #expect(report.failures.isEmpty, "\(report.failures)")
        #expect(report.pushes == 3 && report.shown == 3)
        #expect(report.suspensions >= 2)
        #expect(timeline.events.contains { $0.kind == .connected && $0.process == "app#1" })
        let journal = try String(contentsOfFile: directory.path + "/journal.txt", encoding: .utf8)
        #expect(journal.split(separator: "\n").map { $0.split(separator: " ").first.map(String.init) } == ["m1", "m2", "m3"])
    }

    @Test func aPythonExtensionKeepingAFlockIsKilledWhenSuspended() async throws {
        let directory = try TemporaryContainer()
        let scenario = try Scenario.load(Self.examples + "/locking-scenario.json")
        let (report, _) = try await ScenarioRun(scenario: scenario, container: directory.path).run()
        let kill = try #require(report.deadLockKills.first, "the flock-holding extension was not killed")
        #expect(kill.process == "extension#1")
        #expect(kill.violations.map(\.clause) == [.notADatabase])
        #expect(kill.violations.first?.lock.path == "journal.txt")
        #expect(!report.failures.isEmpty)
    }
}
