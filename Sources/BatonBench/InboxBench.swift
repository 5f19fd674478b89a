import Baton
import BatonCommandSupport
import BatonDatabase
import BatonLoopback
import BatonSpawn
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

        // Already stored: one message in the inbox database. The extension is the sample built
        // the way the README recommends; the floor is the same binary reading the row with GRDB.
        sync()
        let sample = sampleExecutable()
        guard access(sample, X_OK) == 0 else {
            throw CommandOutcome(.notFound, "not found: \(sample); baton bench inbox runs the sample extension built beside baton (swift build -c release --static-swift-stdlib -Xlinker -no-pie --product baton-extension-sample), or set BATON_EXTENSION_SAMPLE")
        }
        let inbox = try await Inbox.open(container: container)
        try await inbox.store(IncomingMessage(id: "stored", payload: Data("hello".utf8)))
        var extensionRuns: [SampleRun] = [], rawRuns: [SampleRun] = []
        for _ in 0..<starts {
            extensionRuns.append(try runSample(sample, [path, "stored"]))
            rawRuns.append(try runSample(sample, ["--raw-read", path, "stored"]))
        }
        // An extension that becomes the executor and runs the (loopback) core.
        var executorRuns: [SampleRun] = []
        for round in 0..<(quick ? 1 : 3) {
            let server = try WorkerProcess(suite: name, container: path, arguments: ["server"])
            guard let line = server.receiveLine(), line.hasPrefix("listening "), let port = UInt16(line.dropFirst("listening ".count)) else {
                throw BatonError(.invalidArgument, "the loopback server did not start")
            }
            for index in 0..<10 {
                _ = try LoopbackClient.command(.push(id: "e\(round)-\(index)", payload: Array("payload \(index)".utf8)), port: port)
            }
            executorRuns.append(try runSample(sample, [path, "e\(round)-9", String(port)]))
        }

        // Bursts.
        var batonTotals: [Double] = [], naiveTotals: [Double] = []
        var batonPerMessage: [Double] = [], naivePerMessage: [Double] = []
        var batonCores: [Int] = [], naiveCores: [Int] = []
        for round in 0..<rounds {
            for naive in [false, true] {
                let result = try burst(path, size: burstSize, naive: naive, database: path + "/burst-\(naive ? "naive" : "baton")-\(round).sqlite")
                if naive {
                    naiveTotals.append(result.total); naivePerMessage += result.perMessage; naiveCores.append(result.cores)
                } else {
                    batonTotals.append(result.total); batonPerMessage += result.perMessage; batonCores.append(result.cores)
                }
            }
        }

        let mib = { (values: [Int]) in Double(values.max() ?? -1) / 1024 }
        let p50mib = { (values: [Int]) in percentile(values.map(Double.init), 50) / 1024 }
        let results = [
            BenchResult(name: "extension_start_to_stored_message_p50_ms", value: percentile(extensionRuns.map(\.milliseconds), 50), unit: "ms",
                        floorName: "grdb_process_start_read_row_p50_ms", floor: percentile(rawRuns.map(\.milliseconds), 50)),
            BenchResult(name: "burst50_total_ms", value: percentile(batonTotals, 50), unit: "ms",
                        floorName: "naive_burst50_total_ms", floor: percentile(naiveTotals, 50)),
            BenchResult(name: "burst50_per_message_p50_ms", value: percentile(batonPerMessage, 50), unit: "ms",
                        floorName: "naive_burst50_per_message_p50_ms", floor: percentile(naivePerMessage, 50)),
            BenchResult(name: "extension_peak_rss_mib", value: mib(extensionRuns.map(\.maxrssKB)), unit: "MiB",
                        floorName: "grdb_read_row_peak_rss_mib", floor: mib(rawRuns.map(\.maxrssKB))),
            BenchResult(name: "extension_peak_rss_vs_ios_limit_mib", value: mib(extensionRuns.map(\.maxrssKB)), unit: "MiB",
                        floorName: "ios_nse_limit_mib", floor: 24),
            BenchResult(name: "executor_extension_peak_rss_mib", value: mib(executorRuns.map(\.maxrssKB)), unit: "MiB",
                        floorName: "ios_nse_limit_mib", floor: 24),
            BenchResult(name: "extension_private_dirty_p50_mib", value: p50mib(extensionRuns.map(\.privateDirtyKB)), unit: "MiB",
                        floorName: "grdb_read_row_private_dirty_p50_mib", floor: p50mib(rawRuns.map(\.privateDirtyKB))),
            BenchResult(name: "executor_extension_private_dirty_p50_mib", value: p50mib(executorRuns.map(\.privateDirtyKB)), unit: "MiB",
                        floorName: "ios_nse_limit_mib", floor: 24),
            BenchResult(name: "extension_vmhwm_mib", value: mib(extensionRuns.map(\.peakKB)), unit: "MiB",
                        floorName: "grdb_read_row_vmhwm_mib", floor: mib(rawRuns.map(\.peakKB))),
        ]
        return (results, [
            "method": "times from posix_spawn of the extension process to the instant (CLOCK_MONOTONIC) it had its message; \(starts) starts; bursts: \(burstSize) messages pushed to the loopback server, then \(burstSize) extension processes spawned at once, \(rounds) round(s) each way; the simulated core takes \(coreStartupMilliseconds) ms to start",
            "source_runs_per_burst": "baton \(batonCores.map(String.init).joined(separator: ",")) vs naive \(naiveCores.map(String.init).joined(separator: ","))",
            "memory": "measured by the extension itself at exit: peak RSS = getrusage(RUSAGE_SELF).ru_maxrss (the sample is started through `sh -c 'X & wait'` so that the kernel does not carry the benchmark's own RSS over the vfork+exec of posix_spawn), VmHWM of /proc/self/status, Private_Dirty of /proc/self/smaps_rollup (after sync(), so freshly built binaries are not counted dirty); the extension is \(sample) (\(extensionRuns.first?.linkage ?? "?")), max over \(starts) runs; executor = the sample running the loopback core for 10 pending messages",
            "cores": "\(sysconf(Int32(_SC_NPROCESSORS_ONLN)))",
        ])
    }

    /// The sample extension next to this executable (override with `BATON_EXTENSION_SAMPLE`).
    private static func sampleExecutable() -> String {
        if let path = environment("BATON_EXTENSION_SAMPLE") { return path }
        let me = selfExecutable()
        return String(me[..<(me.lastIndex(of: "/") ?? me.startIndex)]) + "/baton-extension-sample"
    }

    struct SampleRun {
        var milliseconds: Double
        var peakKB: Int
        var maxrssKB: Int
        var privateDirtyKB: Int
        var linkage: String
    }

    /// Runs the sample extension through `sh -c 'X & wait'` (a fork, so its ru_maxrss is its own)
    /// and parses its `done AT PEAK MAXRSS DIRTY LINKAGE` line.
    private static func runSample(_ sample: String, _ arguments: [String]) throws -> SampleRun {
        // The shell starts with no blocked signal (the spawner's rule): it must see SIGCHLD to
        // reap the sample.
        var spawn = ChildSpawn("/bin/sh", ["-c", "\"$0\" \"$@\" & wait $!", sample] + arguments)
        spawn.standardOutput = .pipe
        let start = monotonicNanoseconds()
        let process = try spawn.spawn()
        let output = process.readOutputToEnd()
        process.wait()
        let lines = String(decoding: output, as: UTF8.self).split(separator: "\n")
        guard let done = lines.first(where: { $0.hasPrefix("done ") })?.split(separator: " "), done.count == 6,
              let at = UInt64(done[1]), let peak = Int(done[2]), let maxrss = Int(done[3]), let dirty = Int(done[4]) else {
            throw BatonError(.invalidArgument, "the sample extension \(sample) \(arguments) said \(lines)")
        }
        return SampleRun(milliseconds: Double(at &- start) / 1e6, peakKB: peak, maxrssKB: maxrss, privateDirtyKB: dirty, linkage: String(done[5]))
    }

    /// `done <monotonic ns>`: when a burst worker had its message.
    private static func parseDone(_ line: String?, worker: WorkerProcess) throws -> (at: UInt64, Void) {
        let fields = (line ?? "").split(separator: " ")
        guard fields.count >= 2, fields[0] == "done", let at = UInt64(fields[1]) else {
            throw BatonError(.invalidArgument, "inbox bench worker \(worker.pid) said \(line ?? "nothing (it ended or did not answer within its time)")")
        }
        return (at, ())
    }

    private static func burst(_ path: String, size: Int, naive: Bool, database: String) throws -> (total: Double, perMessage: [Double], cores: Int) {
        let server = try WorkerProcess(suite: name, container: path, arguments: ["server"])
        guard let line = server.receiveLine(), line.hasPrefix("listening "), let port = UInt16(line.dropFirst("listening ".count)) else {
            throw BatonError(.invalidArgument, "the loopback server did not start")
        }
        for index in 0..<size {
            let reply = try LoopbackClient.command(.push(id: "b\(index)", payload: Array("payload \(index)".utf8)), port: port)
            guard reply == "OK" else { throw BatonError(.invalidArgument, "push failed: \(reply)") }
        }
        let start = monotonicNanoseconds()
        let workers = try (0..<size).map { index in
            try WorkerProcess(suite: name, container: path, arguments: [naive ? "naive" : "extension", "b\(index)", database, String(port), String(coreStartupMilliseconds)])
        }
        var times: [Double] = []
        for worker in workers {
            // Bounded: a worker that hangs (one did, on a deadlock since fixed in the loopback
            // client) fails the bench, and its process goes with the others when they go out.
            let done = try parseDone(worker.receiveLine(timeout: 120), worker: worker)
            times.append(Double(done.at &- start) / 1e6)
            worker.wait()
        }
        let stats = try LoopbackClient.command(.stats, port: port)
        let cores = stats.split(separator: " ").first { $0.hasPrefix("cores=") }.flatMap { Int($0.dropFirst(6)) } ?? -1
        return (times.max() ?? .nan, times, cores)
    }

    // MARK: Workers

    static func worker(arguments: [String], container path: String) async throws {
        switch arguments.first {
        case "server":
            let server = try LoopbackServer(delayMilliseconds: 0)
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
