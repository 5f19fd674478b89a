import Baton
import BatonDatabase
import CBatonShims
import GRDB
import Synchronization
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// `baton bench inbox`: what an extension pays to get its message.
///
/// - start to message when it is already stored: an extension process (`Inbox.open` +
///   `message(id:)` + `claimForDisplay`) beside a process of the same binary that opens the
///   database with plain GRDB and reads the row;
/// - a burst of 50 pushes over 50 extension processes: total time and p50 per message, Baton
///   (one executor runs the core) beside the naive way (every extension starts its own core),
///   with the same simulated core start-up time;
/// - memory of an extension process (peak RSS from getrusage, private dirty from
///   /proc/self/smaps_rollup) beside the plain GRDB reader.
enum InboxBench: BenchSuite {
    static let name = "inbox"
    static let coreStartupMilliseconds = 100

    static func run(container path: String, quick: Bool) async throws -> (results: [BenchResult], notes: [String: String]) {
        let container = try SharedContainer(path: path)
        let starts = quick ? 5 : 20
        let burstSize = 50
        let rounds = quick ? 1 : 3

        // Already stored: one message in the inbox database.
        let inbox = try await Inbox.open(container: container)
        try await inbox.store(IncomingMessage(id: "stored", payload: Data("hello".utf8)))
        let dbPath = path + "/" + Inbox.defaultFileName
        var extensionTimes: [Double] = [], rawTimes: [Double] = []
        var extensionMemory: [(Double, Double)] = [], rawMemory: [(Double, Double)] = []
        for _ in 0..<starts {
            let (time, memory) = try timedWorker(path, ["extension", "stored", dbPath, "0", "0"])
            extensionTimes.append(time)
            extensionMemory.append(memory)
            let (rawTime, rawMem) = try timedWorker(path, ["raw-read", "stored", dbPath])
            rawTimes.append(rawTime)
            rawMemory.append(rawMem)
        }

        // Bursts.
        var batonTotals: [Double] = [], naiveTotals: [Double] = []
        var batonPerMessage: [Double] = [], naivePerMessage: [Double] = []
        var batonCores: [Int] = [], naiveCores: [Int] = []
        var executorMemory: [(Double, Double)] = []
        for round in 0..<rounds {
            for naive in [false, true] {
                let result = try burst(path, size: burstSize, naive: naive, database: path + "/burst-\(naive ? "naive" : "baton")-\(round).sqlite")
                if naive {
                    naiveTotals.append(result.total); naivePerMessage += result.perMessage; naiveCores.append(result.cores)
                } else {
                    batonTotals.append(result.total); batonPerMessage += result.perMessage; batonCores.append(result.cores)
                    executorMemory += result.memory
                }
            }
        }

        let peak = { (samples: [(Double, Double)]) in samples.map(\.0).max() ?? .nan }
        let dirty = { (samples: [(Double, Double)]) in percentile(samples.map(\.1), 50) }
        let results = [
            BenchResult(name: "extension_start_to_stored_message_p50_ms", value: percentile(extensionTimes, 50), unit: "ms",
                        floorName: "grdb_process_start_read_row_p50_ms", floor: percentile(rawTimes, 50)),
            BenchResult(name: "burst50_total_ms", value: percentile(batonTotals, 50), unit: "ms",
                        floorName: "naive_burst50_total_ms", floor: percentile(naiveTotals, 50)),
            BenchResult(name: "burst50_per_message_p50_ms", value: percentile(batonPerMessage, 50), unit: "ms",
                        floorName: "naive_burst50_per_message_p50_ms", floor: percentile(naivePerMessage, 50)),
            BenchResult(name: "extension_peak_rss_mib", value: peak(extensionMemory), unit: "MiB",
                        floorName: "grdb_read_row_peak_rss_mib", floor: peak(rawMemory)),
            BenchResult(name: "extension_private_dirty_p50_mib", value: dirty(extensionMemory), unit: "MiB",
                        floorName: "grdb_read_row_private_dirty_p50_mib", floor: dirty(rawMemory)),
            BenchResult(name: "executor_extension_peak_rss_mib", value: peak(executorMemory), unit: "MiB",
                        floorName: "ios_nse_limit_mib", floor: 24),
            BenchResult(name: "extension_peak_rss_vs_limit_mib", value: peak(extensionMemory), unit: "MiB",
                        floorName: "ios_nse_limit_mib", floor: 24),
        ]
        return (results, [
            "method": "times from posix_spawn of the extension process to the instant (CLOCK_MONOTONIC) it had its message; \(starts) starts; bursts: \(burstSize) messages pushed to the loopback server, then \(burstSize) extension processes spawned at once, \(rounds) round(s) each way; the simulated core takes \(coreStartupMilliseconds) ms to start",
            "source_runs_per_burst": "baton \(batonCores.map(String.init).joined(separator: ",")) vs naive \(naiveCores.map(String.init).joined(separator: ","))",
            "memory": "peak RSS = getrusage(RUSAGE_SELF).ru_maxrss at exit; private dirty = Private_Dirty of /proc/self/smaps_rollup at exit; the extension is this `baton` binary (\(linkage())); executor_extension = the process of a burst that ran the core",
            "cores": "\(sysconf(Int32(_SC_NPROCESSORS_ONLN)))",
        ])
    }

    private static func linkage() -> String {
        guard let maps = try? String(contentsOfFile: "/proc/self/maps", encoding: .utf8) else { return "unknown linkage" }
        return maps.contains("libswiftCore.so") ? "Swift runtime linked dynamically" : "Swift runtime linked statically"
    }

    /// Spawns a worker, waits for its `done` line; returns ms from spawn to its message, and memory.
    private static func timedWorker(_ path: String, _ arguments: [String]) throws -> (Double, (Double, Double)) {
        let start = monotonicNanoseconds()
        let worker = try WorkerProcess(suite: name, container: path, arguments: arguments)
        let done = try parseDone(worker.receiveLine(), worker: worker)
        worker.wait()
        return (Double(done.at &- start) / 1e6, (done.peakKB / 1024, done.dirtyKB / 1024))
    }

    private struct Done {
        var at: UInt64
        var peakKB: Double
        var dirtyKB: Double
    }

    /// `done <monotonic ns> <peak kB> <private dirty kB>`
    private static func parseDone(_ line: String?, worker: WorkerProcess) throws -> Done {
        let fields = (line ?? "").split(separator: " ")
        guard fields.count == 4, fields[0] == "done", let at = UInt64(fields[1]), let peak = Double(fields[2]), let dirty = Double(fields[3]) else {
            throw BatonError(.invalidArgument, "inbox bench worker \(worker.pid) said \(line ?? "nothing")")
        }
        return Done(at: at, peakKB: peak, dirtyKB: dirty)
    }

    private static func burst(_ path: String, size: Int, naive: Bool, database: String) throws -> (total: Double, perMessage: [Double], cores: Int, memory: [(Double, Double)]) {
        let server = try WorkerProcess(suite: name, container: path, arguments: ["server"])
        guard let line = server.receiveLine(), line.hasPrefix("listening "), let port = UInt16(line.dropFirst("listening ".count)) else {
            throw BatonError(.invalidArgument, "the loopback server did not start")
        }
        for index in 0..<size {
            let reply = try LoopbackMessageSource.command("PUSH b\(index) \(Hex.encode(Array("payload \(index)".utf8)))", port: port)
            guard reply == "OK" else { throw BatonError(.invalidArgument, "push failed: \(reply)") }
        }
        let start = monotonicNanoseconds()
        let workers = try (0..<size).map { index in
            try WorkerProcess(suite: name, container: path, arguments: [naive ? "naive" : "extension", "b\(index)", database, String(port), String(coreStartupMilliseconds)])
        }
        var times: [Double] = []
        var memory: [(Double, Double)] = []
        for worker in workers {
            let done = try parseDone(worker.receiveLine(), worker: worker)
            times.append(Double(done.at &- start) / 1e6)
            memory.append((done.peakKB / 1024, done.dirtyKB / 1024))
            worker.wait()
        }
        let stats = try LoopbackMessageSource.command("STATS", port: port)
        let cores = stats.split(separator: " ").first { $0.hasPrefix("cores=") }.flatMap { Int($0.dropFirst(6)) } ?? -1
        // The executor is the process with the largest footprint (it ran the core).
        return (times.max() ?? .nan, times, cores, [memory.max { $0.0 < $1.0 } ?? (.nan, .nan)])
    }

    // MARK: Workers

    static func worker(arguments: [String], container path: String) async throws {
        switch arguments.first {
        case "server":
            let server = try LoopbackMessageServer(delayMilliseconds: 0)
            emit("listening \(server.port)")
            server.serve()
        case "extension" where arguments.count == 5:
            // extension ID DATABASE PORT STARTUP_MS (port 0: no source)
            let container = try SharedContainer(path: path)
            let inbox = try await Inbox.open(container: container, path: arguments[2])
            let port = UInt16(arguments[3]) ?? 0
            let source = port == 0 ? nil : LoopbackMessageSource(port: port, startupDelay: .milliseconds(Int(arguments[4]) ?? 0))
            guard case .message = try await inbox.message(id: arguments[1], deadline: .after(.seconds(60)), source: source) else {
                throw BatonError(.timedOut, "no message \(arguments[1])")
            }
            let at = monotonicNanoseconds()
            _ = try await inbox.claimForDisplay(id: arguments[1])
            reportDone(at: at)
        case "naive" where arguments.count == 5:
            // Every extension starts its own core and stops once its message is stored and the
            // core has nothing pending.
            let container = try SharedContainer(path: path)
            let inbox = try await Inbox.open(container: container, path: arguments[2])
            let id = arguments[1]
            let source = LoopbackMessageSource(port: UInt16(arguments[3]) ?? 0, startupDelay: .milliseconds(Int(arguments[4]) ?? 0))
            let idle = ChangeFlag()
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    try await source.run(delivering: MessageSink(
                        deliver: { message in try await inbox.store(message) },
                        nothingPending: { idle.set() }))
                }
                group.addTask {
                    while true {
                        if idle.isSet, try await inbox.storedMessage(id: id) != nil { return }
                        try await Task.sleep(for: .milliseconds(1))
                    }
                }
                _ = try await group.next()
                group.cancelAll()
            }
            let at = monotonicNanoseconds()
            _ = try await inbox.claimForDisplay(id: id)
            reportDone(at: at)
        case "raw-read" where arguments.count == 3:
            var configuration = Configuration()
            configuration.readonly = true
            let queue = try DatabaseQueue(path: arguments[2], configuration: configuration)
            let payload = try await queue.read { db in
                try Data.fetchOne(db, sql: "SELECT payload FROM \(InboxMessage.databaseTableName) WHERE id = ?", arguments: [arguments[1]])
            }
            guard payload != nil else { throw BatonError(.notFound, "no row \(arguments[1])") }
            reportDone(at: monotonicNanoseconds())
        case "mem" where arguments.count == 4:
            // mem STEP ID DATABASE: one step of an extension alone, for the memory breakdown.
            let container = try SharedContainer(path: path)
            let id = arguments[2], database = arguments[3]
            switch arguments[1] {
            case "pool":
                let pool = try DatabasePool(path: database)
                _ = try await pool.read { db in try Data.fetchOne(db, sql: "SELECT payload FROM \(InboxMessage.databaseTableName) WHERE id = ?", arguments: [id]) }
            case "shared":
                let shared = try await SharedDatabase.open(at: database, container: container, migrator: InboxSchema.migrator)
                _ = try await shared.read { db in try Data.fetchOne(db, sql: "SELECT payload FROM \(InboxMessage.databaseTableName) WHERE id = ?", arguments: [id]) }
            case "role":
                _ = try Role(container, name: "core").status()
            case "signal":
                let observation = try container.signals.observe("baton.inbox")
                observation.cancel()
            case "inbox":
                _ = try await Inbox.open(container: container, path: database).storedMessage(id: id)
            default:
                throw BatonError(.invalidArgument, "unknown step \(arguments[1])")
            }
            reportDone(at: monotonicNanoseconds())
        default:
            throw BatonError(.invalidArgument, "unknown inbox worker \(arguments)")
        }
    }

    private static func reportDone(at: UInt64) {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        emit("done \(at) \(usage.ru_maxrss) \(privateDirtyKilobytes())")
    }

    /// Private_Dirty of this process, in kB, from /proc/self/smaps_rollup.
    static func privateDirtyKilobytes() -> Int {
        guard let text = try? String(contentsOfFile: "/proc/self/smaps_rollup", encoding: .utf8) else { return -1 }
        for line in text.split(separator: "\n") where line.hasPrefix("Private_Dirty:") {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? -1
        }
        return -1
    }

    /// A flag set from the sink, read by the naive worker's loop.
    private final class ChangeFlag: Sendable {
        private let state = Mutex(false)
        var isSet: Bool { state.withLock { $0 } }
        func set() { state.withLock { $0 = true } }
    }
}
