import Baton
import Foundation
import BatonTestSupport
import Logging
import Synchronization
import Testing

/// The container's optional logger reports what Baton repaired or decided on its own (issue 19,
/// "Diagnostics"); nothing without one.
@Suite("Diagnostics")
struct DiagnosticsTests {
    @Test("a rebuilt signal table is reported through the container's logger, and by baton --verbose")
    func rebuiltSignalTableIsLogged() async throws {
        let directory = try TemporaryContainer()
        #expect(try await runBaton(["signal", "post", "x"], container: directory.path).status == 0)
        let table = directory.path + "/.baton/signals"
        func scribble() throws {
            let handle = try #require(FileHandle(forWritingAtPath: table))
            try handle.write(contentsOf: Data("garbage!".utf8))
            try handle.close()
        }
        try scribble()
        let (logger, store) = CapturingLogHandler.logger()
        let container = try SharedContainer(path: directory.path, logger: logger)
        try container.signals.post("x")
        #expect(store.events == ["signal_table_rebuilt"], "\(store.messages)")
        #expect(store.messages.first?.contains(table) == true)

        // The command line prints it with --verbose, and not without.
        try scribble()
        let quiet = try await runBaton(["signal", "post", "x"], container: directory.path)
        #expect(quiet.status == 0 && !quiet.errors.contains { $0.contains("signal_table_rebuilt") }, "\(quiet.errors)")
        try scribble()
        let verbose = try await runBaton(["signal", "post", "x", "--verbose"], container: directory.path)
        #expect(verbose.status == 0)
        #expect(verbose.errors.contains { $0.contains("baton.event=signal_table_rebuilt") }, "\(verbose.errors)")
    }

    @Test("taking a role over from a killed holder is reported, naming it")
    func takeOverIsLogged() async throws {
        let directory = try TemporaryContainer()
        let holder = try ChildProcess(["role", "acquire", "core", "--role", "main", "--hold", "60"], container: directory.path)
        _ = try await holder.line(timeout: 30) { $0.contains("\"acquired\"") }
        holder.signal(SIGKILL)
        _ = try await holder.wait()
        let (logger, store) = CapturingLogHandler.logger()
        let container = try SharedContainer(path: directory.path, logger: logger)
        let lease = try await container.role("core").acquire(priority: .main, deadline: .after(.seconds(30)))
        #expect(store.events.contains("role_taken_over"), "\(store.messages)")
        #expect(store.messages.contains { $0.contains("pid \(holder.pid)") }, "\(store.messages)")
        await lease.release()
    }
}
