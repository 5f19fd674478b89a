import Baton
@testable import BatonDatabase
import BatonFixtures
import Foundation
import GRDB
import Synchronization
import BatonTestSupport
import Testing

/// `PRAGMA data_version` on a connection of its own (``DataVersionReader``), for observations
/// and the relay.
@Suite("data_version connection", .serialized)
struct DataVersionTests {
    func open(_ directory: TemporaryContainer, _ mode: SharedDatabase.SuspensionMode = .rollsBackWrites) async throws -> SharedDatabase {
        let container = try SharedContainer(path: directory.path)
        var configuration = SharedDatabase.Configuration()
        configuration.externalChangePollInterval = .milliseconds(100)
        configuration.suspensionMode = mode
        return try await SharedDatabase.open(at: directory.path + "/app.sqlite", container: container, migrator: TestSchema.migrator(), configuration: configuration)
    }

    @Test("moves on every other connection's commit (this process's writer connection too), holds no transaction between reads, does not wait for a write transaction")
    func dedicatedConnection() async throws {
        let directory = try TemporaryContainer()
        let database = try await open(directory)
        let first = try await database.dataVersion()
        guard case .dedicated = first.connection else {
            Issue.record("read from \(first.connection), not from a connection of its own")
            return
        }
        let reader = try #require(database.versionReader())
        #expect(!reader.isInTransaction)
        #expect(try await database.dataVersion() == first, "no commit, same value")

        try await database.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, 1)") }
        let second = try await database.dataVersion()
        #expect(second.connection == first.connection)
        #expect(second != first, "a Baton write of this process")
        try await database.pool.write { db in try db.execute(sql: "INSERT INTO item(writer, seq) VALUES (1, 2)") }
        let third = try await database.dataVersion()
        #expect(third != second, "a write through the pool")
        #expect(!reader.isInTransaction)

        // A write transaction through the pool, held open: the read neither waits nor sees it.
        // (Held until released; the bound is only a safety net, far past any run: in a full
        // parallel run this task's resumption can wait seconds for a cooperative thread, and a
        // write that committed at a shorter bound before the read made this test fail twice.)
        let write = try await HeldWriterConnection(database.pool, inserting: (writer: 1, seq: 3), bound: .seconds(120))
        // A read that waited for the write would wait until the bound: `held` is then false.
        // (No timing assertion: on a loaded runner the read alone can take over 500 ms.)
        let during = try await database.dataVersion()
        let held = try await write.end()
        #expect(held, "the read waited for the write transaction: it ended at its bound before the read")
        #expect(during == third, "an uncommitted write")
        #expect(try await database.dataVersion() != third, "its commit")
        #expect(!reader.isInTransaction)
    }

    @Test("closesConnections: closed by suspend() with the pool (no lock left), refused while suspended, a new connection after resume(); kept by the default mode")
    func suspension() async throws {
        let directory = try TemporaryContainer()
        let database = try await open(directory, .closesConnections)
        let before = try await database.dataVersion()
        let reader = try #require(database.versionReader())
        await database.suspend()
        #expect(ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true).isEmpty,
                "locks after suspend: \(ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true))")
        await #expect { try await database.dataVersion() } throws: { ($0 as? BatonError)?.code == .suspended }
        #expect(throws: DatabaseError.self) { try reader.read() }
        try await database.resume()
        let after = try await database.dataVersion()
        #expect(after.connection != before.connection, "values of the closed connection are not compared with the new one's")
        #expect(database.versionReader() !== reader)

        let keptDirectory = try TemporaryContainer()
        let kept = try await open(keptDirectory)
        let keptBefore = try await kept.dataVersion()
        let keptReader = try #require(kept.versionReader())
        await kept.suspend()
        await #expect { try await kept.dataVersion() } throws: { ($0 as? BatonError)?.code == .suspended }
        #expect(!keptReader.isInTransaction)
        try await kept.resume()
        #expect(kept.versionReader() === keptReader)
        #expect(try await kept.dataVersion() == keptBefore)
    }

    @Test("closesConnections: observe() sees another process's commit after a suspension closed its data_version connection", .timeLimit(.minutes(1)))
    func observationAcrossAClosingSuspension() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path + "/app.sqlite"
        let database = try await open(directory, .closesConnections)
        var values = database.observe { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM item WHERE writer = 3") ?? 0 }.makeAsyncIterator()
        #expect(try await values.next() == 0)
        await database.suspend()
        #expect(ProcLocks.held(by: getpid(), under: directory.path, exceptOwnerTokens: true).isEmpty)
        try await database.resume()
        let writer = try ChildProcess(harness: ["db-test", "write", path, "--count", "2", "--writer", "3"], container: directory.path)
        #expect(try await writer.wait() == 0)
        var seen = 0
        while seen != 2 { seen = try #require(try await values.next()) }
    }
}
