import Baton
import BatonCommandSupport
import BatonDatabase
import CBatonShims
import GRDB
import GRDBSQLite

/// `baton bench database`: single-row commits per second with 1 and 4 writer processes, the
/// longest wait of any writer, and the time from a commit in one process to a fresh value in an
/// observer of another (Baton's `observe` and a GRDB `ValueObservation` of the pool fed by
/// `SharedDatabase.run()`), beside raw SQLite through its C API (WAL, synchronous=NORMAL, busy
/// timeout 5 s) measured in the same run.
enum DatabaseBench: BenchSuite {
    static let name = "database"
    static let shmName = "bench-database.shm"

    static func run(container path: String, quick: Bool) async throws -> (results: [BenchResult], notes: [String: String]) {
        let container = try SharedContainer(path: path)
        let shm = try MappedFile(container, relativePath: shmName, minimumSize: 4096)
        let commits = quick ? 2_000 : 60_000
        let rounds = quick ? 200 : 1_000
        let rawPath = path + "/raw.sqlite", batonPath = path + "/baton.sqlite"
        // Create both databases first (the Baton one through its migrator).
        _ = try await SharedDatabase.open(at: batonPath, container: container, migrator: migrator)
        try RawSQLite(path: rawPath).close()

        // Alternate raw and Baton runs, five times each, so that load from other processes of the
        // machine (and the disk's moods: a checkpoint's fsync takes 3 to 8 ms here) hits both
        // sides alike: median rate, worst wait and fairness of the runs.
        var raw1 = WriterFigures.none, baton1 = WriterFigures.none, raw4 = WriterFigures.none, baton4 = WriterFigures.none
        var grdb1 = WriterFigures.none
        // Every run writes into a new database, so that runs measure the same thing (the
        // databases of earlier runs would grow unevenly).
        func run(_ mode: String, _ processes: Int) async throws -> WriterFigures {
            let runPath = path + "/run-\(mode)-\(processes).sqlite"
            switch mode {
            case "raw-write": try RawSQLite(path: runPath).close()
            case "grdb-write": try plainPool(path: runPath).close()
            default: _ = try await SharedDatabase.open(at: runPath, container: container, migrator: migrator)
            }
            defer { for suffix in ["", "-wal", "-shm"] { unlink(runPath + suffix) } }
            return try writers(mode: mode, path: runPath, container: path, processes: processes, commits: commits / processes)
        }
        for _ in 0..<(quick ? 1 : 5) {
            raw1 = raw1.merged(try await run("raw-write", 1))
            baton1 = baton1.merged(try await run("baton-write", 1))
            grdb1 = grdb1.merged(try await run("grdb-write", 1))
            raw4 = raw4.merged(try await run("raw-write", 4))
            baton4 = baton4.merged(try await run("baton-write", 4))
        }

        // The floor and Baton's observer alternate round by round (both see the same machine);
        // the ValueObservation watches Baton's database too, so it runs on its own after them.
        let alternated = try await observerLatencies(modes: [("raw", rawPath), ("baton", batonPath)], container: container, containerPath: path, shm: shm, rounds: rounds)
        let (rawLatency, batonLatency) = (alternated[0], alternated[1])
        let grdbLatency = try await observerLatencies(modes: [("grdb", batonPath)], container: container, containerPath: path, shm: shm, rounds: rounds)[0]

        let results = [
            BenchResult(name: "commits_per_s_1_writer", value: baton1.rate, unit: "commits/s", floorName: "raw_sqlite_1_writer", floor: raw1.rate),
            BenchResult(name: "commits_per_s_1_writer_vs_grdb", value: baton1.rate, unit: "commits/s", floorName: "plain_grdb_pool_1_writer", floor: grdb1.rate),
            BenchResult(name: "commits_per_s_4_writers", value: baton4.rate, unit: "commits/s", floorName: "baton_1_writer", floor: baton1.rate),
            BenchResult(name: "commits_per_s_4_writers_vs_raw", value: baton4.rate, unit: "commits/s", floorName: "raw_sqlite_4_writers", floor: raw4.rate),
            BenchResult(name: "longest_wait_4_writers_ms", value: baton4.longestWait, unit: "ms", floorName: "raw_sqlite_4_writers_longest_wait_ms", floor: raw4.longestWait),
            BenchResult(name: "fewest_commits_share_4_writers", value: baton4.fairness, unit: "fraction", floorName: "raw_sqlite_4_writers", floor: raw4.fairness),
            BenchResult(name: "commit_to_observer_p50_ms", value: percentile(batonLatency, 50), unit: "ms", floorName: "raw_commit_futex_wake_read_p50_ms", floor: percentile(rawLatency, 50)),
            BenchResult(name: "commit_to_observer_p99_ms", value: percentile(batonLatency, 99), unit: "ms", floorName: "raw_commit_futex_wake_read_p99_ms", floor: percentile(rawLatency, 99)),
            BenchResult(name: "commit_to_value_observation_p50_ms", value: percentile(grdbLatency, 50), unit: "ms", floorName: "raw_commit_futex_wake_read_p50_ms", floor: percentile(rawLatency, 50)),
            BenchResult(name: "commit_to_value_observation_p99_ms", value: percentile(grdbLatency, 99), unit: "ms", floorName: "raw_commit_futex_wake_read_p99_ms", floor: percentile(rawLatency, 99)),
        ]
        return (results, [
            "method": "writers: \(commits) single-row INSERT transactions in total, split over the processes, started together; each configuration run five times, alternating raw and Baton; rate = total / wall time (median run), each run in a new database, sync(2) before each run; longest wait = slowest single write call of any writer (queue + lock + commit; worst run); fewest share = min over writers of commits done in the first half of the run / fair share (1 = perfectly fair). Plain GRDB: a DatabasePool with the same settings and no Baton, writing on the calling thread (what GRDB itself costs). Observer: \(rounds) paced commits, latency = observer's fresh value time - the stamp written just before COMMIT (observer: SharedDatabase.observe, iterated on container.signals.executor; value_observation: a GRDB ValueObservation of SharedDatabase.pool, fed by SharedDatabase.run()); raw floor = commit, futex wake, read in the other process, its rounds alternating with Baton's observer's. Every observer's read is one statement prepared once (the floor's sqlite3_stmt; GRDB's cachedStatement in both observations), so the figures compare the paths, not the SQL compiler.",
            "settings": "WAL, synchronous=NORMAL, busy timeout 5 s, IMMEDIATE transactions, on both sides",
            "cores": "\(sysconf(Int32(_SC_NPROCESSORS_ONLN)))",
            "ratios_by_run_1_writer_vs_raw": baton1.ratios(over: raw1),
            "ratios_by_run_1_writer_vs_grdb": baton1.ratios(over: grdb1),
            "ratios_by_run_4_writers_vs_1": baton4.ratios(over: baton1),
        ])
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("bench") { db in
            try db.execute(sql: "CREATE TABLE IF NOT EXISTS bench (id INTEGER PRIMARY KEY, writer INTEGER NOT NULL, stamp INTEGER NOT NULL)")
        }
        return migrator
    }

    struct WriterFigures {
        /// The rate of every run, in order.
        var rates: [Double]
        var longestWait: Double
        var fairness: Double

        static let none = WriterFigures(rates: [], longestWait: 0, fairness: 1)

        /// The median rate: the disk's fsync times vary from run to run, and a checkpoint's
        /// sync is in a lone writer's path but overlapped with several writers, so the best of
        /// several runs would favour whichever configuration varies more.
        var rate: Double {
            let sorted = rates.sorted()
            guard !sorted.isEmpty else { return 0 }
            return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
        }

        /// Every rate, worst longest wait, worst fairness.
        func merged(_ other: WriterFigures) -> WriterFigures {
            WriterFigures(rates: rates + other.rates, longestWait: max(longestWait, other.longestWait), fairness: min(fairness, other.fairness))
        }

        /// This configuration's rate over `floor`'s, run by run (the runs alternate).
        func ratios(over floor: WriterFigures) -> String {
            zip(rates, floor.rates).map { String(Double(Int(($0 / $1) * 100 + 0.5)) / 100) }.joined(separator: " ")
        }
    }

    /// Starts `processes` writers, lets them go together, collects their figures.
    private static func writers(mode: String, path: String, container: String, processes: Int, commits: Int) throws -> WriterFigures {
        // Every run starts with no dirty page left by the one before (its WAL tail), so that
        // the kernel's writeback of one configuration's data does not land in another's run.
        sync()
        let workers = try (0..<processes).map { index in
            try WorkerProcess(suite: name, container: container, arguments: [mode, path, String(commits), String(index)])
        }
        for worker in workers { try worker.waitReady() }
        let start = monotonicNanoseconds()
        for worker in workers { worker.send("go \(start)") }
        var longest = 0.0
        var end = start
        for worker in workers {
            guard let line = worker.receiveLine() else {
                throw BatonError(.invalidArgument, "database bench worker \(worker.pid) died")
            }
            let fields = line.split(separator: " ")
            guard fields.count == 4, fields[0] == "result", let finished = UInt64(fields[2]), let wait = Double(fields[3]) else {
                throw BatonError(.invalidArgument, "database bench worker \(worker.pid) said: \(line)")
            }
            end = max(end, finished)
            longest = max(longest, wait / 1e6)
        }
        // Fairness: how many commits each writer finished by the middle of the run.
        let middle = start + (end - start) / 2
        var shares: [Double] = []
        for worker in workers {
            worker.send("middle \(middle)")
            guard let line = worker.receiveLine(), let done = Double(line) else { continue }
            shares.append(done)
        }
        let total = Double(commits * processes)
        let fairShare = shares.reduce(0, +) / Double(max(processes, 1))
        let fairness = fairShare > 0 ? (shares.min() ?? 0) / fairShare : 0
        return WriterFigures(rates: [total / (Double(end - start) / 1e9)], longestWait: longest, fairness: fairness)
    }

    /// A plain GRDB `DatabasePool` with the shared database's SQLite settings and no Baton: what
    /// GRDB itself costs a writer (the benchmark's middle figure).
    static func plainPool(path: String) throws -> DatabasePool {
        var configuration = Configuration()
        configuration.busyMode = .timeout(5)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        let pool = try DatabasePool(path: path, configuration: configuration)
        try pool.write { db in
            try db.execute(sql: "CREATE TABLE IF NOT EXISTS bench (id INTEGER PRIMARY KEY, writer INTEGER NOT NULL, stamp INTEGER NOT NULL)")
        }
        return pool
    }

    /// One single-row transaction on the plain pool, on the calling thread (as the shared
    /// database's fast path writes).
    static func plainInsert(_ pool: DatabasePool, writer: Int64, stamp: UInt64) throws {
        try pool.writeWithoutTransaction { db in
            try db.cachedStatement(sql: "BEGIN IMMEDIATE TRANSACTION").execute()
            try db.cachedStatement(sql: "INSERT INTO bench(writer, stamp) VALUES (?, ?)").execute(arguments: [writer, Int64(bitPattern: stamp)])
            try db.cachedStatement(sql: "COMMIT TRANSACTION").execute()
        }
    }

    /// Paced commits from this process, one per mode in turn each round; each mode's observer
    /// worker reports each latency. Returns the samples of each mode, in the order given.
    private static func observerLatencies(modes: [(mode: String, path: String)], container: SharedContainer, containerPath: String, shm: MappedFile, rounds: Int) async throws -> [[Double]] {
        let wake = shm.pointer.assumingMemoryBound(to: UInt32.self)
        struct Observer {
            let mode: String
            let worker: WorkerProcess
            let database: SharedDatabase?
            let raw: RawSQLite?
        }
        var observers: [Observer] = []
        defer { for observer in observers { try? observer.raw?.close() } }
        for (mode, path) in modes {
            let worker = try WorkerProcess(suite: name, container: containerPath, arguments: ["\(mode)-observe", path])
            try worker.waitReady()
            observers.append(Observer(mode: mode, worker: worker,
                                      database: mode != "raw" ? try await SharedDatabase.open(at: path, container: container, migrator: migrator) : nil,
                                      raw: mode == "raw" ? try RawSQLite(path: path) : nil))
        }
        var samples = [[Double]](repeating: [], count: observers.count)
        let warmup = rounds / 10
        for round in 0..<(rounds + warmup) {
            for (index, observer) in observers.enumerated() {
                if let database = observer.database {
                    try await database.write { db in
                        try db.cachedStatement(sql: "INSERT INTO bench(writer, stamp) VALUES (-1, ?)").execute(arguments: [Int64(bitPattern: monotonicNanoseconds())])
                    }
                } else if let raw = observer.raw {
                    try raw.insert(writer: -1, stampNow: true)
                    baton_add32(wake, 1)
                    AddressWait.wakeAll(wake)
                }
                // A commit that never reaches the observer is a bug to report, not a reason to hang.
                guard let line = observer.worker.receiveLine(timeout: 30), let latency = Double(line) else {
                    throw BatonError(.timedOut, "database bench: the \(observer.mode) observer (process \(observer.worker.pid)) did not see commit \(round) within 30 s")
                }
                if round >= warmup { samples[index].append(latency / 1e6) }
                usleep(1_000)
            }
        }
        return samples
    }

    // MARK: Workers

    static func worker(arguments: [String], container path: String) async throws {
        guard arguments.count >= 2 else { throw BatonError(.invalidArgument, "database bench worker needs MODE PATH") }
        let container = try SharedContainer(path: path)
        let databasePath = arguments[1]
        switch arguments[0] {
        case "raw-write", "baton-write", "grdb-write":
            let commits = Int(arguments[2]) ?? 0
            let writer = Int64(arguments[3]) ?? 0
            var finishTimes: [UInt64] = []
            finishTimes.reserveCapacity(commits)
            var longest: UInt64 = 0
            let database = arguments[0] == "baton-write" ? try await SharedDatabase.open(at: databasePath, container: container, migrator: migrator) : nil
            let raw = arguments[0] == "raw-write" ? try RawSQLite(path: databasePath) : nil
            let pool = arguments[0] == "grdb-write" ? try plainPool(path: databasePath) : nil
            emit("ready")
            _ = readStandardInputLine()
            for _ in 0..<commits {
                let begin = monotonicNanoseconds()
                if let database {
                    try await database.write { db in
                        try db.cachedStatement(sql: "INSERT INTO bench(writer, stamp) VALUES (?, ?)").execute(arguments: [writer, Int64(bitPattern: begin)])
                    }
                } else if let raw {
                    try raw.insert(writer: writer, stampNow: false, stamp: begin)
                } else if let pool {
                    try plainInsert(pool, writer: writer, stamp: begin)
                }
                let end = monotonicNanoseconds()
                longest = max(longest, end - begin)
                finishTimes.append(end)
            }
            try raw?.close()
            emit("result \(commits) \(finishTimes.last ?? 0) \(longest)")
            if let line = readStandardInputLine(), line.hasPrefix("middle "), let middle = UInt64(line.dropFirst(7)) {
                emit("\(finishTimes.filter { $0 <= middle }.count)")
            }
        case "baton-observe":
            let database = try await SharedDatabase.open(at: databasePath, container: container, migrator: migrator)
            // On the signal thread, as the README recommends for latency: the thread that wakes
            // for the commit signal runs the fetch, with no hop to the cooperative pool.
            try await withTaskExecutorPreference(container.signals.executor) {
                var values = database.observe { db in
                    try Int64.fetchOne(db.cachedStatement(sql: "SELECT stamp FROM bench ORDER BY id DESC LIMIT 1"))
                }.makeAsyncIterator()
                var last = try await values.next() ?? nil
                emit("ready")
                while let value = try await values.next() {
                    guard let stamp = value, stamp != last else { continue }
                    last = stamp
                    emit("\(monotonicNanoseconds() &- UInt64(bitPattern: stamp))")
                }
            }
        case "grdb-observe":
            let database = try await SharedDatabase.open(at: databasePath, container: container, migrator: migrator)
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await database.run() }
                let values = ValueObservation
                    .tracking { db in try Int64.fetchOne(db.cachedStatement(sql: "SELECT stamp FROM bench ORDER BY id DESC LIMIT 1")) }
                    .values(in: database.pool)
                var last: Int64?
                var first = true
                for try await value in values {
                    if first {
                        first = false
                        last = value
                        // (A commit made before the relay runs is notified as it starts; the
                        // warm-up rounds absorb that start.)
                        emit("ready")
                        continue
                    }
                    guard let stamp = value, stamp != last else { continue }
                    last = stamp
                    emit("\(monotonicNanoseconds() &- UInt64(bitPattern: stamp))")
                }
            }
        case "raw-observe":
            let shm = try MappedFile(container, relativePath: shmName, minimumSize: 4096)
            let wake = shm.pointer.assumingMemoryBound(to: UInt32.self)
            let raw = try RawSQLite(path: databasePath)
            var seen = baton_load32(wake)
            emit("ready")
            while true {
                _ = AddressWait.wait(on: wake, expecting: seen, timeoutNanoseconds: -1)
                let now = baton_load32(wake)
                guard now != seen else { continue }
                seen = now
                let stamp = try raw.latestStamp()
                emit("\(monotonicNanoseconds() &- UInt64(bitPattern: stamp))")
            }
        default:
            throw BatonError(.invalidArgument, "unknown database bench worker \(arguments)")
        }
    }
}

/// SQLite through its C API, with the settings the shared database uses: the benchmark's floor.
final class RawSQLite {
    private var connection: OpaquePointer?
    private var insertStatement: OpaquePointer?
    private var begin: OpaquePointer?
    private var commit: OpaquePointer?
    private var latest: OpaquePointer?

    init(path: String) throws {
        guard sqlite3_open_v2(path, &connection, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK else {
            throw error("open")
        }
        sqlite3_busy_timeout(connection, 5_000)
        try execute("PRAGMA journal_mode = WAL")
        try execute("PRAGMA synchronous = NORMAL")
        try execute("CREATE TABLE IF NOT EXISTS bench (id INTEGER PRIMARY KEY, writer INTEGER NOT NULL, stamp INTEGER NOT NULL)")
        insertStatement = try prepare("INSERT INTO bench(writer, stamp) VALUES (?, ?)")
        begin = try prepare("BEGIN IMMEDIATE")
        commit = try prepare("COMMIT")
        latest = try prepare("SELECT stamp FROM bench ORDER BY id DESC LIMIT 1")
    }

    private func error(_ doing: String) -> BatonError {
        BatonError(.systemCallFailed, "raw SQLite \(doing) failed: \(String(cString: sqlite3_errmsg(connection)))")
    }

    private func execute(_ sql: String) throws {
        guard sqlite3_exec(connection, sql, nil, nil, nil) == SQLITE_OK else { throw error(sql) }
    }

    private func prepare(_ sql: String) throws -> OpaquePointer? {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(connection, sql, -1, &statement, nil) == SQLITE_OK else { throw error(sql) }
        return statement
    }

    private func step(_ statement: OpaquePointer?, _ what: String) throws {
        defer { sqlite3_reset(statement) }
        let code = sqlite3_step(statement)
        guard code == SQLITE_DONE || code == SQLITE_ROW else { throw error(what) }
    }

    /// One single-row transaction: BEGIN IMMEDIATE, INSERT, COMMIT.
    func insert(writer: Int64, stampNow: Bool, stamp: UInt64 = 0) throws {
        try step(begin, "BEGIN IMMEDIATE")
        sqlite3_bind_int64(insertStatement, 1, writer)
        sqlite3_bind_int64(insertStatement, 2, Int64(bitPattern: stampNow ? monotonicNanoseconds() : stamp))
        do {
            try step(insertStatement, "INSERT")
            try step(commit, "COMMIT")
        } catch {
            sqlite3_exec(connection, "ROLLBACK", nil, nil, nil)
            throw error
        }
    }

    func latestStamp() throws -> Int64 {
        defer { sqlite3_reset(latest) }
        guard sqlite3_step(latest) == SQLITE_ROW else { throw error("SELECT") }
        return sqlite3_column_int64(latest, 0)
    }

    func close() throws {
        for statement in [insertStatement, begin, commit, latest] { sqlite3_finalize(statement) }
        insertStatement = nil; begin = nil; commit = nil; latest = nil
        if connection != nil { sqlite3_close_v2(connection) }
        connection = nil
    }

    deinit { try? close() }
}
