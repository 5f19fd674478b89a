import Baton
import Foundation
import BatonTestSupport
import Testing

@Suite("Presence of real processes")
struct PresenceTests {
    @Test("a live holder is listed; after SIGKILL it is gone at once and observers are told")
    func killedHolderDisappears() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let holder = try ChildProcess(["presence", "hold", "--kind", "extension"], container: directory.path)
        try await holder.line(timeout: 30) { $0.hasPrefix("registered") }

        let live = try container.presence.list()
        #expect(live.map(\.pid) == [holder.pid])
        #expect(live.first?.kind == "extension")
        #expect(try container.presence.isAlive(pid: holder.pid))

        var changes = container.presence.changes().makeAsyncIterator()
        let first = try await changes.next()
        #expect(first?.map(\.pid) == [holder.pid])

        holder.signal(SIGKILL)
        _ = try await holder.wait()
        // No heartbeat to wait out: the kernel dropped the lock with the process.
        #expect(try container.presence.isAlive(pid: holder.pid) == false)
        let next = try await changes.next()
        #expect(next == [])
        // The stale file was cleaned up.
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path + "/.baton/presence")
        #expect(files.isEmpty)
    }

    @Test("the command line lists live processes as JSON with kind, pid and since")
    func listJSON() async throws {
        let directory = try TemporaryContainer()
        let app = try ChildProcess(["presence", "hold", "--kind", "app"], container: directory.path)
        try await app.line(timeout: 30) { $0.hasPrefix("registered") }
        let result = try await runBaton(["presence", "list", "--json"], container: directory.path)
        #expect(result.status == 0)
        let data = Data(try #require(result.lines.first).utf8)
        let array = try #require(try JSONSerialization.jsonObject(with: data) as? [[String: Any]])
        #expect(array.count == 1)
        #expect(array.first?["kind"] as? String == "app")
        #expect(array.first?["pid"] as? Int == Int(app.pid))
        #expect(array.first?["since"] is String)
        app.signal(SIGTERM)
        #expect(try await app.wait() == 0)
        #expect(try SharedContainer(path: directory.path).presence.list().isEmpty)
    }

    @Test("suspend() releases the presence lock and resume() takes it back")
    func suspension() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let registration = try container.presence.register(kind: "app")
        #expect(!ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
        await container.suspend()
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty)
        #expect(try container.presence.isAlive(id: registration.record.id) == false)
        #expect { _ = try container.presence.register(kind: "late") } throws: { ($0 as? BatonError)?.code == .suspended }
        try await container.resume()
        #expect(try container.presence.isAlive(id: registration.record.id))
        registration.release()
        #expect(try container.presence.list().isEmpty)
    }

    @Test("a live process whose presence file is corrupt is still listed, as unknown")
    func corruptFileOfALiveProcess() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let holder = try ChildProcess(["presence", "hold", "--kind", "extension"], container: directory.path)
        let registered = try await holder.line(timeout: 30) { $0.hasPrefix("registered") }
        let id = try #require(registered.split(separator: " ").first { $0.hasPrefix("id=") }?.dropFirst(3))
        // Overwrite the content in place: the holder's lock is on the same file and stays held.
        let file = FileHandle(forWritingAtPath: directory.path + "/.baton/presence/\(id).lock")
        try #require(file).write(Data(repeating: 0xFF, count: 64))
        try file?.close()
        let live = try container.presence.list()
        #expect(live.count == 1, "a live process disappeared because its file is corrupt: \(live)")
        #expect(live.first?.kind == "unknown")
        #expect(live.first?.id == String(id))
        #expect(try container.presence.isAlive(id: String(id)))
        holder.signal(SIGKILL)
        _ = try await holder.wait()
        #expect(try container.presence.list().isEmpty)
    }

    @Test("a symbolic link, a directory or a FIFO in presence/ is skipped, not fatal")
    func oddEntries() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let registration = try container.presence.register(kind: "app")
        let presence = directory.path + "/.baton/presence"
        try FileManager.default.createSymbolicLink(atPath: presence + "/link.lock", withDestinationPath: "/etc/passwd")
        try FileManager.default.createDirectory(atPath: presence + "/dir.lock", withIntermediateDirectories: false)
        #expect(mkfifo(presence + "/fifo.lock", 0o600) == 0)
        let live = try await within(5, "listing presence with odd entries") { try container.presence.list() }
        #expect(live.map(\.pid) == [getpid()])
        let result = try await runBaton(["presence", "list"], container: directory.path, timeout: 10)
        #expect(result.status == 0, "\(result.errors)")
        #expect(result.lines.count == 1)
        #expect(result.errors.filter { $0.contains("skipped") }.count == 3, "\(result.errors)")
        registration.release()
    }

    @Test("a bad kind is refused")
    func badKind() throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        #expect { _ = try container.presence.register(kind: "") } throws: { ($0 as? BatonError)?.code == .invalidName }
    }
}
