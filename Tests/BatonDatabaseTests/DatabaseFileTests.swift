import Baton
import BatonDatabase
import Foundation
import GRDB
import BatonTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The database file itself: its permissions, its owner, and what is found in its place. Real
/// `baton` processes, real SQLite files.
@Suite("Database files", .serialized)
struct DatabaseFileTests {
    /// One table `t(x)`: the database the lock tests open.
    static var oneTableMigrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in try db.execute(sql: "CREATE TABLE t(x)") }
        return migrator
    }

    static func inode(_ path: String) -> UInt64? {
        var info = stat()
        return stat(path, &info) == 0 ? UInt64(info.st_ino) : nil
    }

    static func mode(_ path: String) -> mode_t? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return info.st_mode & 0o7777
    }

    @Test("the inbox database, its -wal and -shm are created 0600 under umask 022")
    func createdPrivate() async throws {
        let directory = try TemporaryContainer()
        let previous = umask(0o022)
        defer { umask(previous) }
        let put = try await runBaton(["inbox", "put", "m1", "hello"], container: directory.path)
        #expect(put.status == 0, "\(put.lines) \(put.errors)")
        // A reader that stays open keeps -wal and -shm around while they are checked.
        let database = directory.path + "/baton-inbox.sqlite"
        for suffix in ["", "-wal", "-shm"] {
            let mode = Self.mode(database + suffix)
            #expect(mode == 0o600, "baton-inbox.sqlite\(suffix) is \(String(mode ?? 0, radix: 8))")
        }
    }

    @Test("a database writable by others is refused")
    func writableByOthers() async throws {
        let directory = try TemporaryContainer()
        #expect(try await runBaton(["inbox", "put", "m1", "hello"], container: directory.path).status == 0)
        let database = directory.path + "/baton-inbox.sqlite"
        #expect(chmod(database, 0o666) == 0)
        let get = try await runBaton(["inbox", "get", "m1", "--timeout", "1"], container: directory.path)
        #expect(get.status == 77)
        #expect(!get.lines.contains("hello"), "a database that anyone may write was read: \(get.lines)")
        #expect(get.errors.contains { $0.contains("writableByOthers") }, "\(get.errors)")
    }

    @Test("a database owned by another user is refused (as root)")
    func ownedByAnotherUser() async throws {
        guard geteuid() == 0 else { return }  // only root can hand a file to another user
        let directory = try TemporaryContainer()
        #expect(try await runBaton(["inbox", "put", "m1", "hello"], container: directory.path).status == 0)
        // Another user replaced the database with one of theirs.
        let database = directory.path + "/baton-inbox.sqlite"
        for suffix in ["", "-wal", "-shm"] { _ = chown(database + suffix, 65534, 65534) }
        let get = try await runBaton(["inbox", "get", "m1", "--timeout", "1"], container: directory.path)
        #expect(get.status == 77)
        #expect(!get.lines.contains("hello"), "a database of another user was read: \(get.lines)")
        #expect(get.errors.contains { $0.contains("ownedByAnotherUser") }, "\(get.errors)")
    }

    @Test("another user's files are 0600 and theirs; root refuses their container unless told to trust it")
    func anotherUser() async throws {
        guard geteuid() == 0, access("/usr/bin/setpriv", X_OK) == 0 else { return }  // as in CI: root, util-linux
        let directory = try TemporaryContainer()
        #expect(chmod(directory.path, 0o755) == 0)
        let theirs = directory.path + "/theirs"
        #expect(mkdir(theirs, 0o700) == 0)
        #expect(chown(theirs, 65534, 65534) == 0)
        let previous = umask(0o022)
        defer { umask(previous) }
        let child = try ChildProcess(
            rawArguments: [Array("inbox".utf8), Array("put".utf8), Array("m1".utf8), Array("theirs".utf8)],
            container: theirs, program: "/usr/bin/setpriv",
            programArguments: ["--reuid=65534", "--regid=65534", "--clear-groups"])
        let status = try await child.wait()
        if child.errorLines.contains(where: { $0.contains("setpriv") || $0.contains("Permission denied") }) {
            return  // the build directory is not reachable by an unprivileged user here
        }
        #expect(status == 0, "\(child.errorLines)")
        for suffix in ["", "-wal", "-shm"] {
            var info = stat()
            #expect(stat(theirs + "/baton-inbox.sqlite" + suffix, &info) == 0)
            #expect(info.st_mode & 0o7777 == 0o600 && info.st_uid == 65534, "baton-inbox.sqlite\(suffix)")
        }
        // Root does not read a container another user owns...
        let refused = try await runBaton(["inbox", "get", "m1", "--timeout", "1"], container: theirs)
        #expect(refused.status == 77)
        #expect(refused.errors.count == 1 && refused.errors[0].contains("ownedByAnotherUser"), "\(refused.errors)")
        // ...unless told to trust other users.
        let trusted = try await runBaton(["inbox", "get", "m1", "--timeout", "1", "--trust-other-users"], container: theirs)
        #expect(trusted.status == 0, "\(trusted.errors)")
        #expect(trusted.lines == ["theirs"])
    }

    @Test("a FIFO in place of the database is refused at once")
    func fifoDatabase() async throws {
        let directory = try TemporaryContainer()
        let database = directory.path + "/baton-inbox.sqlite"
        #expect(mkfifo(database, 0o600) == 0)
        // "At once" is "not at the deadline": the get's deadline (120 s) is far beyond the
        // bound (60 s), so a start slowed by a loaded runner passes, and a get that waited for
        // its deadline, or an open(2) blocked on the FIFO, fails.
        for arguments in [["inbox", "get", "m1", "--timeout", "120"], ["db", "check", database]] {
            let started = Date()
            let child = try ChildProcess(arguments, container: directory.path)
            let status = try await child.wait(timeout: 60)
            #expect(Date().timeIntervalSince(started) < 60, "\(arguments) waited on a FIFO")
            #expect(status == 77, "\(arguments): \(child.lines) \(child.errorLines)")
            #expect(child.errorLines.contains { $0.contains("notARegularFile") }, "\(arguments): \(child.errorLines)")
        }
    }

    @Test("database.suspend() (closesConnections) releases every lock on the database's files; only container.suspend() releases the owner token too")
    func suspensionScope() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let migrator = Self.oneTableMigrator
        let path = directory.path + "/app.sqlite"
        var configuration = SharedDatabase.Configuration()
        configuration.suspensionMode = .closesConnections
        let database = try await SharedDatabase.open(at: path, container: container, migrator: migrator, configuration: configuration)
        // Observing commits claims this process's entry in the signal table (a lock).
        let commits = try await database.commits(table: "t")
        var iterator = commits.makeAsyncIterator()
        try await database.write { db in try db.execute(sql: "INSERT INTO t VALUES (1)") }
        _ = try await iterator.next()
        let databaseFiles = Set(["", "-wal", "-shm"].compactMap { Self.inode(path + $0) })
        await database.suspend()
        let held = ProcLocks.held(by: getpid(), under: directory.path)
        #expect(held.allSatisfy { !databaseFiles.contains($0.inode) }, "a lock on the database's files after database.suspend(): \(held)")
        // What is left is the process's owner token (.baton/owners/<token>), which owns its
        // signal-table entry: released by the container's suspension.
        let owners = (try? FileManager.default.contentsOfDirectory(atPath: directory.path + "/.baton/owners")) ?? []
        let tokens = Set(owners.compactMap { Self.inode(directory.path + "/.baton/owners/" + $0) })
        #expect(!held.isEmpty && held.allSatisfy { tokens.contains($0.inode) }, "\(held)")
        await container.suspend()
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
        try await container.resume()
        try await database.resume()
    }

    @Test("a FIFO in place of the -wal file is refused at once")
    func fifoWAL() async throws {
        let directory = try TemporaryContainer()
        #expect(try await runBaton(["inbox", "put", "m1", "hello"], container: directory.path).status == 0)
        let wal = directory.path + "/baton-inbox.sqlite-wal"
        _ = unlink(wal)
        #expect(mkfifo(wal, 0o600) == 0)
        // As above: a deadline far beyond the bound, so only a wait fails, not a slow start.
        let started = Date()
        let child = try ChildProcess(["inbox", "get", "m1", "--timeout", "120"], container: directory.path)
        let status = try await child.wait(timeout: 60)
        #expect(Date().timeIntervalSince(started) < 60)
        #expect(status == 77, "\(child.lines) \(child.errorLines)")
        #expect(child.errorLines.contains { $0.contains("notARegularFile") }, "\(child.errorLines)")
    }

    /// POSIX record locks belong to a process and a file, not to a descriptor: closing *any*
    /// descriptor of a file drops every such lock the process holds on it (sqlite.org,
    /// "How To Corrupt An SQLite Database File", 2.2). A second open of a database already open
    /// in this process (two notification-extension instances in one process, each with its own
    /// `Inbox`) must therefore never open and close the database's files itself: if it did, the
    /// first connection's shared lock on the `-shm` dead-man byte would be gone, and the next
    /// process to open the database would truncate the `-shm` under this process's mapping
    /// (a SIGBUS in SQLite, seen in CI) or run recovery on a WAL index in use.
    @Test("a second open of a database already open in this process keeps the first one's SQLite locks")
    func aSecondOpenKeepsTheFirstOnesLocks() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let migrator = Self.oneTableMigrator
        let path = directory.path + "/app.sqlite"
        let first = try await SharedDatabase.open(at: path, container: container, migrator: migrator)
        try await first.write { db in try db.execute(sql: "INSERT INTO t VALUES (1)") }
        #expect(try await first.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM t") } == 1)
        let shm = try #require(Self.inode(path + "-shm"))
        func shmLocks() -> [ProcLocks.Entry] {
            ProcLocks.held(by: getpid(), under: directory.path).filter { $0.inode == shm && $0.kind == "POSIX" }
        }
        #expect(!shmLocks().isEmpty, "an open WAL connection holds a shared lock on its -shm")
        let second = try await SharedDatabase.open(at: path, container: container, migrator: migrator)
        #expect(!shmLocks().isEmpty, "the second open dropped the first connection's lock on the -shm")
        let reader = try #require(try await SharedDatabase.openReadOnly(at: path, container: container, migrator: migrator))
        #expect(!shmLocks().isEmpty, "a read-only open dropped the first connection's lock on the -shm")
        // The three go on: a write through the second is seen by the reader and the first.
        try await second.write { db in try db.execute(sql: "INSERT INTO t VALUES (2)") }
        #expect(try await reader.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM t") } == 2)
        #expect(try await first.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM t") } == 2)
    }
}
