import Baton
import BatonDatabase
import Foundation
import BatonTestSupport
import Testing

/// The inbox with real processes: a loopback message server (`baton-harness inbox loopback serve`), an
/// app process holding the main role (`baton-harness inbox app`) and extension processes
/// (`baton-harness inbox extension`), all on one real SQLite database in a temporary container.
@Suite("Inbox", .serialized)
struct InboxTests {
    // MARK: Helpers

    /// A loopback message server child and its port.
    struct Server {
        let process: ChildProcess
        let port: String
        let container: String

        init(container: String, delayMilliseconds: Int = 0) async throws {
            process = try ChildProcess(harness: ["inbox", "loopback", "serve", "--delay-ms", String(delayMilliseconds)], container: container)
            let line = try await process.line(timeout: 20) { $0.hasPrefix("listening ") }
            port = String(line.dropFirst("listening ".count))
            self.container = container
        }

        func push(_ messages: [(String, String)]) async throws {
            let result = try await runHarness(["inbox", "loopback", "push", "--port", port] + messages.map { "\($0.0)=\($0.1)" }, container: container)
            #expect(result.status == 0, "push failed: \(result.lines)")
        }

        func stats() async throws -> [String: Int] {
            let result = try await runHarness(["inbox", "loopback", "stats", "--port", port], container: container)
            let object = try #require(result.lines.last.flatMap(InboxTests.object))
            return object.compactMapValues { $0 as? Int }
        }
    }

    static func object(_ line: String) -> [String: Any]? {
        (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
    }

    /// The `message` events an extension process printed: id -> (route, shown, payload).
    static func messages(_ lines: [String]) -> [String: (route: String, shown: Bool, payload: String)] {
        var result: [String: (String, Bool, String)] = [:]
        for line in lines {
            guard let object = object(line), object["event"] as? String == "message", let id = object["id"] as? String else { continue }
            result[id] = (object["route"] as? String ?? "", object["shown"] as? Bool ?? false, object["payload"] as? String ?? "")
        }
        return result
    }

    static func storedIDs(_ container: String) async throws -> Set<String> {
        let result = try await runBaton(["inbox", "list", "--json"], container: container)
        #expect(result.status == 0)
        let line = try #require(result.lines.last)
        let array = try #require((try JSONSerialization.jsonObject(with: Data(line.utf8))) as? [[String: Any]])
        return Set(array.compactMap { $0["id"] as? String })
    }

    static func startApp(_ container: String, port: String) async throws -> ChildProcess {
        let app = try ChildProcess(harness: ["inbox", "app", "--port", port], container: container)
        try await app.line(timeout: 30) { $0.contains("\"main\"") }
        try await app.line(timeout: 30) { $0.contains("source-connected") }
        return app
    }

    // MARK: Command line basics

    @Test func putGetListAndClaimFromTheCommandLine() async throws {
        let container = try TemporaryContainer()
        let put = try await runBaton(["inbox", "put", "call-1", "hello"], container: container.path)
        #expect(put.status == 0 && put.lines == ["stored call-1"])
        let again = try await runBaton(["inbox", "put", "call-1", "other"], container: container.path)
        #expect(again.lines == ["duplicate call-1"])
        let get = try await runBaton(["inbox", "get", "call-1"], container: container.path)
        #expect(get.status == 0 && get.lines == ["hello"])
        #expect(try await Self.storedIDs(container.path) == ["call-1"])

        // `get` waits for another process to store the message.
        let waiting = try ChildProcess(["inbox", "get", "call-2", "--timeout", "30"], container: container.path)
        try await Task.sleep(for: .milliseconds(300))
        _ = try await runBaton(["inbox", "put", "call-2", "later"], container: container.path)
        #expect(try await waiting.wait(timeout: 30) == 0)
        #expect(waiting.lines == ["later"])

        // Exit 3 on timeout.
        let missing = try await runBaton(["inbox", "get", "nobody", "--timeout", "0.3"], container: container.path)
        #expect(missing.status == 3)
    }

    @Test func exactlyOneOfManyProcessesClaimsAMessage() async throws {
        let container = try TemporaryContainer()
        _ = try await runBaton(["inbox", "put", "pay-1", "1000 sat"], container: container.path)
        let claimers = try (0..<8).map { _ in try ChildProcess(["inbox", "claim", "pay-1"], container: container.path) }
        var statuses: [Int32] = []
        for claimer in claimers { statuses.append(try await claimer.wait(timeout: 60)) }
        #expect(statuses.filter { $0 == 0 }.count == 1, "statuses: \(statuses)")
        #expect(statuses.filter { $0 == 1 }.count == 7)
    }

    @Test func expiredMessagesAreRemovedAndCannotBeClaimed() async throws {
        let container = try TemporaryContainer()
        _ = try await runBaton(["inbox", "put", "old", "x", "--lifetime", "0.2"], container: container.path)
        _ = try await runBaton(["inbox", "put", "fresh", "y"], container: container.path)
        try await Task.sleep(for: .milliseconds(400))
        let claim = try await runBaton(["inbox", "claim", "old"], container: container.path)
        #expect(claim.status == 1)
        #expect(try await Self.storedIDs(container.path) == ["fresh"])
    }

    @Test func aLifetimeThatIsNotANumberOfSecondsIsRefusedNotTakenForADuplicate() async throws {
        let directory = try TemporaryContainer()
        let inbox = try await Inbox.open(container: try SharedContainer(path: directory.path))
        for lifetime in [Double.nan, -1, .infinity, -.infinity] {
            await #expect {
                try await inbox.store(IncomingMessage(id: "m", payload: Data("x".utf8), lifetime: lifetime))
            } throws: { ($0 as? BatonError)?.code == .invalidArgument }
        }
        // A huge lifetime is kept (cut to what a date can hold), not refused.
        #expect(try await inbox.store(IncomingMessage(id: "m", payload: Data("x".utf8), lifetime: 1e300)))
        #expect(try await Self.storedIDs(directory.path) == ["m"])
    }

    // MARK: App and extensions

    @Test func withTheAppRunningAnExtensionGetsTheMessageFromTheStore() async throws {
        let container = try TemporaryContainer()
        let server = try await Server(container: container.path)
        let app = try await Self.startApp(container.path, port: server.port)
        let extensionProcess = try ChildProcess(harness: ["inbox", "extension", "--port", server.port, "--timeout", "30", "call-x"], container: container.path)
        try await Task.sleep(for: .milliseconds(300))
        try await server.push([("call-x", "ring ring")])
        #expect(try await extensionProcess.wait(timeout: 40) == 0)
        let got = Self.messages(extensionProcess.lines)
        #expect(got["call-x"]?.payload == "ring ring")
        #expect(got["call-x"]?.route == "storedByAnotherProcess" || got["call-x"]?.route == "alreadyStored")
        #expect(got["call-x"]?.shown == true)
        // Only the app's core ever connected: the extension did not start a second one.
        #expect(try await server.stats()["cores"] == 1)
        _ = app
    }

    @Test func withoutTheAppAnExtensionBecomesTheExecutorAndStoresEverythingPending() async throws {
        let container = try TemporaryContainer()
        let server = try await Server(container: container.path)
        try await server.push([("m1", "one"), ("m2", "two"), ("m3", "three")])
        let first = try await runHarness(["inbox", "extension", "--port", server.port, "m1"], container: container.path, timeout: 40)
        #expect(first.status == 0)
        #expect(Self.messages(first.lines)["m1"]?.route == "receivedByThisProcess")
        #expect(try await Self.storedIDs(container.path) == ["m1", "m2", "m3"])
        // The next extension finds its message without starting anything.
        let second = try await runHarness(["inbox", "extension", "--port", server.port, "m3"], container: container.path, timeout: 40)
        #expect(Self.messages(second.lines)["m3"]?.route == "alreadyStored")
        let stats = try await server.stats()
        #expect(stats["cores"] == 1)
        #expect(stats["pending"] == 0)
    }

    @Test func anExtensionThatCannotGetItsMessageReturnsTimedOut() async throws {
        let container = try TemporaryContainer()
        // No app, no source: nobody will ever store it.
        let result = try await runHarness(["inbox", "extension", "--timeout", "1.5", "--margin", "1", "never"], container: container.path, timeout: 30)
        #expect(result.status == 3)
        #expect(result.lines.contains { $0.contains("\"timedOut\"") && $0.contains("never") }, "\(result.lines)")
    }

    @Test func aBurstOf25PushesRunsTheSourceOnceAndShowsEachMessageOnce() async throws {
        let container = try TemporaryContainer()
        let server = try await Server(container: container.path)
        let ids = (1...25).map { "burst-\($0)" }
        try await server.push(ids.map { ($0, "payload of \($0)") })
        // 20 extension processes with one instance each, and one process with 5 instances.
        var processes = try ids.prefix(20).map {
            try ChildProcess(harness: ["inbox", "extension", "--port", server.port, "--timeout", "60", $0], container: container.path)
        }
        processes.append(try ChildProcess(harness: ["inbox", "extension", "--port", server.port, "--timeout", "60"] + ids.suffix(5), container: container.path))
        var shown: [String: Int] = [:]
        var received: [String: String] = [:]
        for process in processes {
            #expect(try await process.wait(timeout: 90) == 0, "\(process.arguments): \(process.lines), stderr: \(process.errorLines)")
            for _ in 0..<200 where !process.outputClosed { try await Task.sleep(for: .milliseconds(5)) }
            for (id, message) in Self.messages(process.lines) {
                received[id] = message.payload
                if message.shown { shown[id, default: 0] += 1 }
            }
        }
        #expect(received.count == 25)
        for id in ids {
            #expect(received[id] == "payload of \(id)")
            #expect(shown[id] == 1, "\(id) shown \(shown[id] ?? 0) times")
        }
        let stats = try await server.stats()
        #expect(stats["cores"] == 1, "the source ran \(stats["cores"] ?? -1) times")
        #expect(stats["pending"] == 0)
        // Nobody else may show them again.
        let again = try await runBaton(["inbox", "claim", "burst-7"], container: container.path)
        #expect(again.status == 1)
    }

    @Test func theAppLaunchedDuringAnExecutorRunStopsItWithoutLoss() async throws {
        let container = try TemporaryContainer()
        let server = try await Server(container: container.path, delayMilliseconds: 400)
        let ids = (1...6).map { "slow-\($0)" }
        try await server.push(ids.map { ($0, "p-\($0)") })
        let executor = try ChildProcess(harness: ["inbox", "extension", "--port", server.port, "--timeout", "60", "slow-6"], container: container.path)
        try await executor.line(timeout: 30) { $0.contains("stored slow-1") }
        let app = try await Self.startApp(container.path, port: server.port)
        #expect(try await executor.wait(timeout: 60) == 0, "\(executor.lines)")
        for _ in 0..<200 where !executor.outputClosed { try await Task.sleep(for: .milliseconds(5)) }
        let got = Self.messages(executor.lines)
        #expect(got["slow-6"]?.payload == "p-slow-6")
        #expect(got["slow-6"]?.route == "storedByAnotherProcess", "the app's core should have received it: \(executor.lines)")
        #expect(try await Self.storedIDs(container.path) == Set(ids))
        let stats = try await server.stats()
        #expect(stats["cores"] == 2)
        #expect(stats["pending"] == 0)
        _ = app
    }

    @Test func aKilledExecutorIsTakenOverWithNothingLostAndNothingShownTwice() async throws {
        let container = try TemporaryContainer()
        let server = try await Server(container: container.path, delayMilliseconds: 300)
        let ids = (1...6).map { "k-\($0)" }
        try await server.push(ids.map { ($0, "p-\($0)") })
        let doomed = try ChildProcess(harness: ["inbox", "extension", "--port", server.port, "--timeout", "60", "k-6"], container: container.path)
        try await doomed.line(timeout: 30) { $0.contains("stored k-2") }
        doomed.signal(SIGKILL)
        _ = try await doomed.wait(timeout: 10)
        let successor = try await runHarness(["inbox", "extension", "--port", server.port, "--timeout", "60", "k-6"], container: container.path, timeout: 60)
        #expect(successor.status == 0, "\(successor.lines)")
        let got = Self.messages(successor.lines)
        #expect(got["k-6"]?.route == "receivedByThisProcess")
        #expect(got["k-6"]?.shown == true)
        #expect(try await Self.storedIDs(container.path) == Set(ids))
        #expect(try await server.stats()["cores"] == 2)
        // Every message can be shown exactly once more (k-6 was shown by the successor).
        for id in ids {
            let claim = try await runBaton(["inbox", "claim", id], container: container.path)
            #expect(claim.status == (id == "k-6" ? 1 : 0), "\(id): \(claim.lines)")
        }
    }
}
