import Baton
import BatonBench
import BatonLoopback
import BatonTestSupport
import Foundation
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The loopback fixture's server on its own, over real TCP on 127.0.0.1: the lifecycle
/// benchmark's quiet mode (it speaks only when spoken to) and its wait for a connection.
@Suite("Loopback server")
struct LoopbackServerTests {
    /// Reads one line from a blocking socket (nil at the end of the stream).
    private static func line(_ fd: Int32) -> String? {
        var bytes: [UInt8] = []
        var byte: UInt8 = 0
        while read(fd, &byte, 1) == 1 {
            if byte == 10 { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(byte)
        }
        return nil
    }

    /// Whether a line arrives within `milliseconds`, and which.
    private static func line(_ fd: Int32, within milliseconds: Int32) -> String? {
        var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, milliseconds) == 1 else { return nil }
        return line(fd)
    }

    /// The lines a core receives after its `HELLO`: the replies to two `STATS` commands (the
    /// second sent once the first reply arrived, so in a batch of its own after the `HELLO`'s),
    /// then whatever else arrives until an `IDLE` line, or for `quiet` milliseconds.
    private static func linesAfterHello(messaging: Bool, quiet: Int32) throws -> [String] {
        let server = try LoopbackServer(messaging: messaging)
        let fd = try LoopbackSocket.connected(port: server.port)
        defer { close(fd) }
        #expect(LoopbackSocket.write(fd, "HELLO core 1 0\nSTATS\n"))
        var lines: [String] = []
        for command in 0..<2 {
            if command == 1 { #expect(LoopbackSocket.write(fd, "STATS\n")) }
            while let line = Self.line(fd) {
                lines.append(line)
                if line.hasPrefix("STATS") { break }
            }
        }
        while !lines.contains("IDLE"), let line = Self.line(fd, within: quiet) { lines.append(line) }
        return lines
    }

    /// A messaging server tells a new core that nothing waits for it (`IDLE`); a quiet one, as
    /// the lifecycle benchmark runs it, sends nothing it was not asked for, so no client's
    /// thread wakes for it in the middle of a measured hand-over.
    @Test func aQuietServerSendsNothingItWasNotAskedFor() throws {
        let told = try Self.linesAfterHello(messaging: true, quiet: 2_000)
        #expect(told.contains("IDLE"), "\(told)")
        let quiet = try Self.linesAfterHello(messaging: false, quiet: 200)
        #expect(quiet.count == 2, "\(quiet)")
        #expect(quiet.allSatisfy { $0.hasPrefix("STATS") }, "\(quiet)")
    }

    /// `waitForOpenConnection(named:timeout:)` returns when a connection with that name says
    /// `HELLO` (woken by the server's thread, long before its timeout), and false at its
    /// timeout when none does.
    @Test func theWaitForAConnectionEndsAtItsHello() async throws {
        let server = try LoopbackServer(messaging: false)
        #expect(!server.waitForOpenConnection(named: "late", timeout: .milliseconds(50)))
        // Another name, open before the wait, does not end it.
        let other = try LoopbackSocket.connected(port: server.port)
        defer { close(other) }
        #expect(LoopbackSocket.write(other, "HELLO other 1 0\n"))
        // The connection is open (accepted) before the wait starts: only its HELLO can end it.
        let late = try LoopbackSocket.connected(port: server.port)
        defer { close(late) }
        try await eventually("the server accepts both connections") { server.openConnections.count == 2 }
        let waiting = Task { try await onOwnThread { server.waitForOpenConnection(named: "late", timeout: .seconds(60)) } }
        try await Task.sleep(for: .milliseconds(100))
        #expect(LoopbackSocket.write(late, "HELLO late 2 0\n"))
        // Well before the wait's 60 s timeout: the HELLO woke it (a wait that only looked again
        // at its timeout would have returned true too, after 60 s).
        let opened = try await within(30, "the wait for the named connection") { try await waiting.value }
        #expect(opened)
    }

    /// A hand-over benchmark's round starts at the holder's *next* connection
    /// (``HolderConnections``): a connection the last round preempted does not start the next
    /// one while the server still lists it open (on a loaded machine the server's thread reads
    /// its end late), and a holder that connected fewer times than one more than the rounds
    /// (a round that preempted nothing) fails the measurement.
    @Test func aHandOverRoundStartsAtTheHoldersNextConnection() async throws {
        let server = try LoopbackServer(messaging: false)
        let holder = HolderConnections()
        let first = try LoopbackSocket.connected(port: server.port)
        defer { close(first) }
        #expect(LoopbackSocket.write(first, "HELLO holder 1 0\n"))
        // (The waits sleep in the kernel: each on a thread of its own, not one of the tasks'.)
        let firstID = try await onOwnThread { try holder.waitForNext(server, name: "holder", timeout: .seconds(30)) }
        holder.preempted(firstID)
        // Still open at the server (as a preempted connection whose end it has not read yet):
        // not a start for the next round.
        #expect(server.openConnections.contains { $0.id == firstID })
        #expect(try await onOwnThread { server.waitForOpenConnection(named: "holder", after: firstID, timeout: .milliseconds(50)) } == nil)
        await #expect(throws: BatonError.self) { try await onOwnThread { try holder.waitForNext(server, name: "holder", timeout: .milliseconds(50)) } }
        // One round, one connection: a measurement that ended here preempted nothing after it.
        #expect(throws: BatonError.self) {
            try holder.checkEveryRoundPreempted(server.records.filter { $0.name == "holder" }, rounds: 1, what: "the holder")
        }
        // The holder's next connection, while the first is still open, starts the next round.
        let second = try LoopbackSocket.connected(port: server.port)
        defer { close(second) }
        #expect(LoopbackSocket.write(second, "HELLO holder 1 0\n"))
        let secondID = try await onOwnThread { try holder.waitForNext(server, name: "holder", timeout: .seconds(30)) }
        #expect(secondID > firstID)
        try holder.checkEveryRoundPreempted(server.records.filter { $0.name == "holder" }, rounds: 1, what: "the holder")
        // Rounds that this side counts must match too.
        #expect(throws: BatonError.self) {
            try holder.checkEveryRoundPreempted(server.records.filter { $0.name == "holder" }, rounds: 2, what: "the holder")
        }
    }

    /// `waitUntil(timeout:_:)` waits suspended and looks again at each change of the records:
    /// a `PING` ends a wait for it at once (a wait woken only by opens and closes, or one that
    /// looked only at its timeout, would run into the 60 s timeout); it throws `timedOut` with
    /// the records when its timeout passes, and `CancellationError` when cancelled.
    @Test func theWaitForTheRecordsEndsAtTheChangeItWaitsFor() async throws {
        let server = try LoopbackServer(messaging: false)
        let fd = try LoopbackSocket.connected(port: server.port)
        defer { close(fd) }
        #expect(LoopbackSocket.write(fd, "HELLO pinger 1 0\n"))
        try await server.waitUntil(timeout: 30) { $0.first?.name == "pinger" }

        let waiting = Task { try await server.waitUntil(timeout: 60) { ($0.first?.pings ?? 0) >= 2 } }
        try await Task.sleep(for: .milliseconds(100))
        #expect(LoopbackSocket.write(fd, "PING\n"))
        #expect(LoopbackSocket.write(fd, "PING\n"))
        let records = try await within(30, "the wait for two pings") { try await waiting.value }
        #expect(records.first?.pings == 2)

        await #expect {
            try await server.waitUntil(timeout: 0.05) { _ in false }
        } throws: { error in
            (error as? BatonError)?.code == .timedOut && "\(error)".contains("pinger")
        }

        let cancelled = Task { try await server.waitUntil(timeout: 60) { _ in false } }
        try await Task.sleep(for: .milliseconds(50))
        cancelled.cancel()
        await #expect(throws: CancellationError.self) {
            try await within(30, "the cancelled wait") { try await cancelled.value }
        }
    }
}
