import ArgumentParser
import Baton
import BatonCommandSupport
import BatonSpawn
import CBatonHarness
import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// One benchmark figure beside the raw primitive measured in the same run.
struct BenchResult: Encodable, Sendable {
    var name: String
    var value: Double
    var unit: String
    var floorName: String
    var floor: Double
    /// `value / floor`.
    var ratio: Double
    /// What else ran on the machine: `idle` or `loaded` (see ``BenchCondition``).
    var condition = BenchCondition.idle.rawValue

    init(name: String, value: Double, unit: String, floorName: String, floor: Double) {
        self.name = name
        self.value = value
        self.unit = unit
        self.floorName = floorName
        self.floor = floor
        self.ratio = floor == 0 ? 0 : value / floor
    }

    enum CodingKeys: String, CodingKey {
        case name, value, unit, floor, ratio, condition
        case floorName = "floor_name"
    }
}

/// What else runs on the machine while a suite measures. Every suite runs under each condition
/// asked for (both by default), and each result names its condition.
enum BenchCondition: String, CaseIterable, Sendable {
    /// Nothing started by the bench besides the suite's own processes.
    case idle
    /// One CPU-bound process per online core, started before the suite and killed after it, so
    /// that a process that sleeps competes for a core when it wakes (as on a busy phone).
    case loaded

    /// Starts what the condition needs; the returned processes are killed when released.
    func start(container: String) throws -> [WorkerProcess] {
        guard self == .loaded else { return [] }
        let cores = max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN)))
        return try (0..<cores).map { _ in
            let worker = try WorkerProcess(suite: BenchCondition.loadWorker, container: container, arguments: [])
            try worker.waitReady()
            return worker
        }
    }

    /// The `bench-worker` name of a CPU-bound load process.
    static let loadWorker = "load"
}

/// What every suite prints: `{"suite": NAME, "results": [...]}` plus run facts.
struct BenchReport: Encodable, Sendable {
    var suite: String
    var results: [BenchResult]
    var build: String
    var notes: [String: String]
}

/// A benchmark suite: `baton bench NAME`. Workers run as `baton-harness bench-worker NAME ...`
/// (``harnessExecutable()``: `baton-harness` next to `baton`).
protocol BenchSuite: SendableMetatype {
    static var name: String { get }
    /// Runs the suite in a fresh temporary container; returns results and free-form notes.
    static func run(container: String, quick: Bool) async throws -> (results: [BenchResult], notes: [String: String])
    /// Runs one worker process of the suite (spawned by `run`).
    static func worker(arguments: [String], container: String) async throws
}

/// Every suite, by name. Each area adds its own here.
let benchSuites: [any BenchSuite.Type] = [
    SignalsBench.self,
    DatabaseBench.self,
    ChannelsBench.self,
    RolesBench.self,
    DefaultsBench.self,
    InboxBench.self,
    LifecycleBench.self,
]

package struct BenchCommand: AsyncParsableCommand {
    package static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Run a benchmark suite (use a release build: swift build -c release, then .build/release/baton bench SUITE --json).",
        discussion: "Suites: \(benchSuites.map { $0.name }.joined(separator: ", ")). Each figure is printed beside the raw primitive measured in the same run, with ratio = value / floor."
    )

    @Argument(help: "The suite to run.") var suite: String
    @Flag(help: "Print one JSON object.") var json = false
    @Flag(help: "Fewer iterations (for smoke tests).") var quick = false
    @Option(help: "Run in this container directory instead of a temporary one.") var container: String?
    @Option(help: "Conditions to measure under, comma-separated: idle, loaded (one CPU-bound process per core, started and stopped by the bench).")
    var conditions = "idle,loaded"

    package init() {}

    package func run() async throws {
        guard let type = benchSuites.first(where: { $0.name == suite }) else {
            throw ValidationError("unknown suite \(suite); choose one of: \(benchSuites.map { $0.name }.joined(separator: ", "))")
        }
        let harness = harnessExecutable()
        guard access(harness, X_OK) == 0 else {
            throw CommandOutcome(.notFound, "not found: \(harness); baton bench runs its workers in baton-harness, built beside baton (swift build -c release --product baton-harness), or set BATON_HARNESS_EXECUTABLE")
        }
        #if DEBUG
        let build = "debug"
        FileHandleOutput.standardError("warning: this is a debug build; measure with `swift run -c release baton bench \(suite)`")
        #else
        let build = "release"
        #endif
        var chosen: [BenchCondition] = []
        for word in conditions.split(separator: ",") {
            guard let condition = BenchCondition(rawValue: String(word)) else {
                throw ValidationError("unknown condition \(word); choose from: \(BenchCondition.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            chosen.append(condition)
        }
        guard !chosen.isEmpty else { throw ValidationError("--conditions names no condition") }
        var results: [BenchResult] = []
        var notesByCondition: [(condition: String, notes: [String: String])] = []
        for condition in chosen {
            // A fresh container for each condition, so the second run does not reuse the first's files.
            let directory = try container.map { $0 + "/" + condition.rawValue } ?? makeTemporaryDirectory(prefix: "baton-bench")
            if container != nil { _ = mkdir(directory, 0o700) }
            defer { if container == nil { removeTree(directory) } }
            let load = try condition.start(container: directory)
            let (measured, suiteNotes) = try await type.run(container: directory, quick: quick)
            withExtendedLifetime(load) {}
            results += measured.map { var result = $0; result.condition = condition.rawValue; return result }
            notesByCondition.append((condition.rawValue, suiteNotes))
        }
        var notes = Self.merge(notesByCondition)
        notes["conditions"] = "idle: nothing else started by the bench; loaded: \(sysconf(Int32(_SC_NPROCESSORS_ONLN))) CPU-bound processes (one per core) running throughout"
        let report = BenchReport(suite: suite, results: results, build: build, notes: notes)
        if json {
            emit(try jsonLine(report))
        } else {
            emit("suite \(suite) (\(build) build)")
            for result in results {
                emit("  [\(result.condition)] \(result.name): \(fixed(result.value)) \(result.unit)   floor \(result.floorName): \(fixed(result.floor))   ratio \(fixed(result.ratio))")
            }
            for (key, value) in notes.sorted(by: { $0.key < $1.key }) { emit("  note \(key): \(value)") }
        }
    }
}

extension BenchCommand {
    /// The notes of every condition's run, as one: a note the same in every run once, a note
    /// that differs (a measured breakdown) once per condition, as `key_condition`.
    package static func merge(_ runs: [(condition: String, notes: [String: String])]) -> [String: String] {
        var merged: [String: String] = [:]
        for key in Set(runs.flatMap { $0.notes.keys }) {
            let values = runs.map { $0.notes[key] }
            if let first = values.first, values.allSatisfy({ $0 == first }), let first {
                merged[key] = first
            } else {
                for run in runs { if let value = run.notes[key] { merged["\(key)_\(run.condition)"] = value } }
            }
        }
        return merged
    }
}

package struct BenchWorkerCommand: AsyncParsableCommand {
    package static let configuration = CommandConfiguration(
        commandName: "bench-worker", abstract: "A worker process of a benchmark suite (spawned by `baton bench`).")
    @Argument var suite: String
    @Option var container: String
    @Argument(parsing: .captureForPassthrough) var arguments: [String] = []

    package init() {}

    package func run() async throws {
        if suite == BenchCondition.loadWorker {
            // CPU-bound until killed (the bench kills it; it dies with its parent too).
            emit("ready")
            var state: UInt64 = 0x9E37_79B9_7F4A_7C15
            while true {
                for _ in 0..<1_000_000 { state = state &* 6_364_136_223_846_793_005 &+ 1 }
                if state == 0 { emit("") } // keeps the loop from being optimized away
            }
        }
        guard let type = benchSuites.first(where: { $0.name == suite }) else {
            throw ValidationError("unknown suite \(suite)")
        }
        try await type.worker(arguments: arguments, container: container)
    }
}

// MARK: - Measurement helpers

/// The `p`-th percentile (0...100) of `samples`, by nearest rank.
func percentile(_ samples: [Double], _ p: Double) -> Double {
    guard !samples.isEmpty else { return .nan }
    let sorted = samples.sorted()
    let rank = Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1
    return sorted[min(max(rank, 0), sorted.count - 1)]
}

/// A worker child process for benchmarks: `baton-harness bench-worker SUITE --container DIR ARGS...`.
/// Its standard input and output are close-on-exec pipes of the one spawner (``ChildSpawn``);
/// it is SIGKILLed and reaped on deinit.
final class WorkerProcess {
    private let process: SpawnedProcess
    let pid: pid_t
    let input: Int32
    let output: Int32

    init(suite: String, container: String, arguments: [String]) throws {
        let executable = harnessExecutable()
        var spawn = ChildSpawn(executable, ["bench-worker", "--container", container, suite] + arguments)
        spawn.standardInput = .pipe
        spawn.standardOutput = .pipe
        spawn.dieWithParent()
        process = try spawn.spawn()
        self.pid = process.pid
        self.input = process.input!
        self.output = process.output!
    }

    /// Writes one line to the worker's standard input.
    func send(_ line: String) {
        var text = line + "\n"
        text.withUTF8 { _ = write(input, $0.baseAddress, $0.count) }
    }

    /// Waits for the worker's `ready` line.
    func waitReady() throws {
        let line = receiveLine()
        guard line == "ready" else {
            throw BatonError(.invalidArgument, "bench worker \(pid) did not start (said \(line ?? "nothing"))")
        }
    }

    /// Reads one line from the worker's standard output (blocking; benchmarks only). With
    /// `timeout` (seconds), `nil` when no whole line came in that time: a benchmark then reports
    /// the stall instead of hanging.
    func receiveLine(timeout: Double? = nil) -> String? {
        var bytes: [UInt8] = []
        var byte: UInt8 = 0
        let end = timeout.map { monotonicNanoseconds() &+ UInt64($0 * 1e9) }
        while true {
            if let end {
                let now = monotonicNanoseconds()
                guard now < end else { return nil }
                var descriptor = pollfd(fd: output, events: Int16(POLLIN), revents: 0)
                let ready = poll(&descriptor, 1, Int32(min((end - now) / 1_000_000 + 1, 60_000)))
                if ready < 0 && errno == EINTR { continue }
                guard ready > 0 else { continue }
            }
            guard read(output, &byte, 1) == 1 else { break }
            if byte == 10 { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(byte)
        }
        return bytes.isEmpty ? nil : String(decoding: bytes, as: UTF8.self)
    }

    func kill(_ signal: Int32 = SIGKILL) { process.signal(signal) }

    /// Waits for exit and returns the exit status (128+N when killed by signal N).
    @discardableResult
    func wait() -> Int32 { process.wait() }
}

/// Runs `body` with every thread of this process pinned to the processor it runs on now (threads
/// and processes started meanwhile inherit the pin), then undoes the pin, also when `body`
/// throws; `nil` without running `body` where the process cannot be pinned (not Linux). For a
/// suite's one-processor rows.
func onOneProcessor<R>(_ body: () async throws -> R) async throws -> R? {
    let processor = max(CurrentProcessor.hint, 1) - 1
    guard baton_bench_pin_process(Int32(processor)) == 0 else {
        _ = baton_bench_unpin_process()
        return nil
    }
    defer { _ = baton_bench_unpin_process() }
    return try await body()
}
