import ArgumentParser
import Baton
import BatonCommandSupport
import BatonDatabase
import BatonSimulator
import CBatonShims
import GRDB
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

struct DatabaseCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "db",
        abstract: "Inspect and watch a shared SQLite database.",
        subcommands: [Check.self, Watch.self]
    )

    struct Check: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Integrity check, journal mode, WAL size, page count, schema version, and the processes that hold the database open. Exits 6 when the integrity check fails.")
        @Option(name: .long, help: "The shared container directory, to name the holders' kinds (default: $BATON_CONTAINER).")
        var container: String?
        @Argument(help: "The database file.") var path: String
        @Flag(help: "Print one JSON object.") var json = false

        func run() async throws {
            let report = try DatabaseReport.make(path: path, containerPath: container ?? environment("BATON_CONTAINER"))
            if json {
                emit(try jsonLine(report.json))
            } else {
                for line in report.lines { emit(line) }
            }
            if !report.integrityOK { throw CommandOutcome(.damaged, "damaged: the integrity check of \(path) failed") }
        }
    }

    struct Watch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a line per commit made by any process: `commit seq=N count=K pid=P`, or `commit external` for a program that does not use Baton. Exits 0 after --count commits, 3 on timeout.")
        @OptionGroup var options: ContainerOptions
        @Argument(help: "The database file.") var path: String
        @Option(help: "Only commits that changed this table (external writes are always shown).") var table: String?
        @Option(help: "Exit after this many commits.", transform: ArgumentCheck.count) var count: Int?
        @Option(help: "Exit with status 3 after this many seconds without finishing.", transform: ArgumentCheck.seconds) var timeout: Double?
        @Option(help: "Seconds between checks for writes by programs that do not use Baton.", transform: ArgumentCheck.positiveSeconds) var poll: Double = 1
        @Flag(help: "Print 'ready' once watching (for scripts and tests).") var announce = false

        func run() async throws {
            let container = try options.open()
            var settings = SharedDatabase.Configuration()
            settings.externalChangePollInterval = .milliseconds(Int64(max(poll, 0.01) * 1000))
            guard let database = try await SharedDatabase.openReadOnly(at: path, container: container, configuration: settings) else {
                throw BatonError(.notFound, "\(path) does not exist yet; create it with SharedDatabase.open first")
            }
            let commits = try await database.commits(table: table)
            if announce { emit("ready") }
            let limit = count
            let finished = try await withThrowingTaskGroup(of: Bool.self) { group in
                group.addTask {
                    var seen = 0
                    var iterator = commits.makeAsyncIterator()
                    while limit.map({ seen < $0 }) ?? true {
                        guard let commit = try await iterator.next() else { return true }
                        if let sequence = commit.sequence {
                            emit("commit seq=\(sequence) count=\(commit.count) pid=\(commit.processID.map(String.init) ?? "?")")
                        } else {
                            emit("commit external")
                        }
                        seen += commit.count
                    }
                    return true
                }
                if let timeout {
                    group.addTask {
                        try await Task.sleep(for: .milliseconds(Int64(timeout * 1000)))
                        return false
                    }
                }
                defer { group.cancelAll() }
                return try await group.next() ?? true
            }
            if !finished { throw CommandOutcome.timedOut("\(count.map { "\($0) commits" } ?? "commits") to \(path)", after: timeout) }
        }
    }
}

/// What `baton db check` reports.
struct DatabaseReport {
    var path: String
    var integrity: [String]
    var journalMode: String
    var walBytes: Int
    var pageCount: Int
    var pageSize: Int
    var userVersion: Int
    var migrations: [String]
    var holders: [(pid: Int32, kind: String?)]

    var integrityOK: Bool { integrity == ["ok"] }

    static func make(path: String, containerPath: String?) throws -> DatabaseReport {
        guard FileManager.default.fileExists(atPath: path) else {
            throw BatonError(.notFound, "\(path) does not exist")
        }
        // Refuses a FIFO (which would block SQLite's open) or a directory at once; the owner is
        // not checked: inspecting another user's database is what this command is for.
        try SharedDatabase.checkFiles(at: path, create: false, trustsOtherUsers: true)
        var configuration = GRDB.Configuration()
        configuration.readonly = true
        configuration.busyMode = .timeout(5)
        let facts: (integrity: [String], journal: String, pages: Int, pageSize: Int, version: Int, migrations: [String])
        do {
            let queue = try DatabaseQueue(path: path, configuration: configuration)
            defer { try? queue.close() }
            facts = try queue.read { db in
                let integrity: [String]
                do {
                    integrity = try String.fetchAll(db, sql: "PRAGMA integrity_check")
                } catch let error as DatabaseError where error.resultCode == .SQLITE_CORRUPT {
                    integrity = ["database disk image is malformed (the integrity check could not finish)"]
                }
                let journal = try String.fetchOne(db, sql: "PRAGMA journal_mode") ?? "?"
                let pages = try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0
                let pageSize = try Int.fetchOne(db, sql: "PRAGMA page_size") ?? 0
                let version = try Int.fetchOne(db, sql: "PRAGMA user_version") ?? 0
                let migrations = try db.tableExists("grdb_migrations")
                    ? String.fetchAll(db, sql: "SELECT identifier FROM grdb_migrations ORDER BY rowid") : []
                return (integrity, journal, pages, pageSize, version, migrations)
            }
        } catch let error as DatabaseError where error.resultCode == .SQLITE_NOTADB {
            throw BatonError(.notADatabase, "\(path) is not an SQLite database (its header is wrong)", cause: error)
        } catch let error as DatabaseError where error.resultCode == .SQLITE_CORRUPT {
            // Too damaged to finish the checks: report it as an integrity failure.
            facts = (["database disk image is malformed (SQLite error \(error.extendedResultCode.rawValue)); restore it from a backup"], "?", 0, 0, 0, [])
        }
        var walInfo = stat()
        let walBytes = stat(path + "-wal", &walInfo) == 0 ? Int(walInfo.st_size) : 0
        let kinds: [Int32: String]
        if let containerPath, let container = try? SharedContainer(path: containerPath),
           let records = try? container.presence.list() {
            kinds = Dictionary(records.map { ($0.pid, $0.kind) }, uniquingKeysWith: { first, _ in first })
        } else {
            kinds = [:]
        }
        let holders = Self.holders(of: [path, path + "-shm"]).map { (pid: $0, kind: kinds[$0]) }
        return DatabaseReport(
            path: path, integrity: facts.integrity, journalMode: facts.journal, walBytes: walBytes,
            pageCount: facts.pages, pageSize: facts.pageSize, userVersion: facts.version,
            migrations: facts.migrations, holders: holders)
    }

    /// Processes (other than this one) holding a lock on any of `paths`, from `/proc/locks`: an
    /// open WAL connection always holds a read lock on the `-shm` file.
    static func holders(of paths: [String]) -> [Int32] {
        var inodes = Set<UInt64>()
        for path in paths {
            var info = stat()
            if stat(path, &info) == 0 { inodes.insert(UInt64(info.st_ino)) }
        }
        // ProcFS reads /proc/locks to its end (Foundation's String(contentsOfFile:) stops after
        // one page of it).
        let me = getpid()
        let pids = Set(ProcFS.locks().filter { inodes.contains($0.inode) && $0.pid != me }.map(\.pid))
        return pids.sorted()
    }

    var json: JSONValue {
        .object([
            "path": .string(path),
            "integrity": .string(integrity.joined(separator: "; ")),
            "integrity_ok": .bool(integrityOK),
            "journal_mode": .string(journalMode),
            "wal_bytes": .int(walBytes),
            "page_count": .int(pageCount),
            "page_size": .int(pageSize),
            "user_version": .int(userVersion),
            "migrations": .array(migrations.map(JSONValue.string)),
            "holders": .array(holders.map { holder in
                .object(["pid": .int(Int(holder.pid)), "kind": holder.kind.map(JSONValue.string) ?? .null])
            }),
        ])
    }

    var lines: [String] {
        [
            "database \(path)",
            "  integrity: \(integrity.prefix(5).joined(separator: "; "))\(integrity.count > 5 ? " (\(integrity.count) problems)" : "")",
            "  journal mode: \(journalMode)",
            "  WAL: \(walBytes) bytes",
            "  pages: \(pageCount) x \(pageSize) bytes",
            "  schema: user_version \(userVersion), migrations \(migrations.isEmpty ? "none" : migrations.joined(separator: ", "))",
            "  held open by: \(holders.isEmpty ? "no other process" : holders.map { "\($0.pid)\($0.kind.map { " (\($0))" } ?? "")" }.joined(separator: ", "))",
        ]
    }
}
