import ArgumentParser
import Baton
import BatonCommandSupport
import BatonDatabase
import BatonSimulator
import CBatonShims
import GRDB
import GRDBSQLite
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// `baton-harness sim-lock-holder`: a program that holds one kind of lock in the container when it is
/// suspended, to test each clause of the 0xDEAD10CC rule (internal: driven by the simulator
/// over the lifecycle protocol, as any program would be).
struct SimulatorLockHolderCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sim-lock-holder", abstract: "Hold one kind of lock across suspension (tests the 0xDEAD10CC rule).")

    enum Hold: String, ExpressibleByArgument, CaseIterable {
        /// `flock` on a plain file.
        case flock
        /// A read transaction on a DELETE-mode database (SQLite's SHARED lock).
        case deleteDatabase = "delete-db"
        /// An open write transaction (`BEGIN IMMEDIATE`) on a WAL database.
        case walWrite = "wal-write"
        /// WAL readers only: one connection in a read transaction, one idle.
        case walRead = "wal-read"
        /// A read transaction on a WAL database whose header is not SQLite's (as if encrypted).
        case unrecognised
    }

    @OptionGroup var options: ContainerOptions
    @Option(help: "Unused (the simulator passes its server's port to every mode).") var port: UInt16?
    @Option(help: "What to hold: \(Hold.allCases.map(\.rawValue).joined(separator: ", ")).") var hold: Hold

    func run() async throws {
        let container = try options.open()
        var connections: [OpaquePointer] = []
        var descriptors: [Int32] = []
        switch hold {
        case .flock:
            let fd = openFile(container.path + "/plain.lock", O_RDWR | O_CREAT | O_CLOEXEC)
            guard fd >= 0, flock(fd, LOCK_EX) == 0 else { throw ValidationError("flock: \(String(cString: strerror(errno)))") }
            descriptors.append(fd)
        case .deleteDatabase:
            let db = try Self.database(container.path + "/delete.sqlite")
            try Self.execute(db, "PRAGMA journal_mode=DELETE; CREATE TABLE IF NOT EXISTS t(x); INSERT INTO t VALUES (1); BEGIN; SELECT count(*) FROM t;")
            connections.append(db)
        case .walWrite:
            let db = try Self.database(container.path + "/wal.sqlite")
            try Self.execute(db, "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS t(x); BEGIN IMMEDIATE; INSERT INTO t VALUES (1);")
            connections.append(db)
        case .walRead:
            let writer = try Self.database(container.path + "/wal.sqlite")
            try Self.execute(writer, "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS t(x); INSERT INTO t VALUES (1);")
            let reader = try Self.database(container.path + "/wal.sqlite")
            try Self.execute(reader, "BEGIN; SELECT count(*) FROM t;")
            connections += [writer, reader]
        case .unrecognised:
            // A WAL database, then its header overwritten as an encrypted database's would be.
            let path = container.path + "/encrypted.sqlite"
            let db = try Self.database(path)
            try Self.execute(db, "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS t(x); INSERT INTO t VALUES (1); PRAGMA wal_checkpoint(TRUNCATE);")
            let fd = openFile(path, O_WRONLY | O_CLOEXEC)
            _ = pwrite(fd, Array(repeating: UInt8(0xA5), count: 16), 16, 0)
            POSIX.close(fd)
            // The lock a reader would take on the lock page (SQLite itself would now refuse the file).
            let lockFD = openFile(path, O_RDWR | O_CLOEXEC)
            var lock = flock()
            lock.l_type = Int16(F_RDLCK)
            lock.l_whence = Int16(SEEK_SET)
            lock.l_start = 0x4000_0002
            lock.l_len = 510
            guard fcntl(lockFD, F_SETLK, &lock) == 0 else { throw ValidationError("fcntl: \(String(cString: strerror(errno)))") }
            descriptors.append(lockFD)
            connections.append(db)
        }
        ChildChannel.emit(.ready, detail: hold.rawValue)
        for await command in ChildChannel.commands() {
            switch command.command {
            case .willSuspend: ChildChannel.emit(.releasedLocks, detail: "kept on purpose: \(hold.rawValue)")
            case .exit: break
            default: continue
            }
            if command.command == .exit { break }
        }
        for db in connections { sqlite3_close_v2(db) }
        for fd in descriptors { POSIX.close(fd) }
    }

    static func database(_ path: String) throws -> OpaquePointer {
        var db: OpaquePointer?
        guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK, let db else {
            throw ValidationError("cannot open \(path)")
        }
        return db
    }

    static func execute(_ db: OpaquePointer, _ sql: String) throws {
        guard sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK else {
            throw ValidationError("SQLite: \(String(cString: sqlite3_errmsg(db)))")
        }
    }
}

/// `baton-harness sim-grdb-app`: an app that uses GRDB and keeps a write transaction open when it goes
/// to the background (internal). Plain, it uses its own `DatabasePool` and is killed at
/// suspension; with `--baton` the pool is a ``SharedDatabase`` and the container's suspension
/// interrupts and rolls back the write before the process is stopped.
struct SimulatorGRDBAppCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sim-grdb-app", abstract: "A GRDB app with a write open across the background transition.")

    @OptionGroup var options: ContainerOptions
    @Option(help: "Unused (the simulator passes its server's port to every mode).") var port: UInt16?
    @Flag(help: "Open the database with Baton and suspend the container at will-suspend.") var baton = false

    func run() async throws {
        let container = try options.open()
        let path = container.path + "/app.sqlite"
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in try db.create(table: "note") { $0.column("text", .text) } }
        let write: @Sendable (@escaping @Sendable (Database) throws -> Void) async throws -> Void
        if baton {
            let database = try await SharedDatabase.open(at: path, container: container, migrator: migrator)
            write = { body in try await database.write(body) }
        } else {
            let pool = try DatabasePool(path: path)
            try migrator.migrate(pool)
            write = { body in try await pool.write(body) }
        }
        ChildChannel.emit(.ready, detail: baton ? "GRDB with Baton" : "plain GRDB")
        await withThrowingTaskGroup(of: Void.self) { group in
            for await command in ChildChannel.commands() {
                switch command.command {
                case .background:
                    // A long write: a sync that outlives the background time.
                    group.addTask {
                        do {
                            try await write { db in
                                try db.execute(sql: "INSERT INTO note(text) VALUES ('syncing')")
                                for _ in 0..<600 {
                                    try db.execute(sql: "SELECT count(*) FROM note")
                                    usleep(50_000)
                                }
                            }
                        } catch {
                            ChildChannel.emit(.error, detail: "the write ended: \(error)")
                        }
                    }
                case .willSuspend:
                    if baton { await container.suspend() }
                    ChildChannel.emit(.releasedLocks)
                case .resume:
                    if baton { try? await container.resume() }
                case .exit:
                    exitNow()  // without waiting for a write that may be sleeping
                default:
                    break
                }
            }
            exitNow()
        }
    }
}

/// `open(2)` with mode 0644, outside types that declare their own `open`.
private func openFile(_ path: String, _ flags: Int32) -> Int32 { open(path, flags, 0o644) }

/// Exits the process now, without waiting for tasks (a blocked write) to finish.
private func exitNow() -> Never { exit(0) }
