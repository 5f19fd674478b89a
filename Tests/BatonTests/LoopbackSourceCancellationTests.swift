import Baton
import BatonLoopback
import BatonTestSupport
import Synchronization
import Testing
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// A loopback message source cancelled while its server sends. Found in the inbox benchmark
/// under load: a worker hung for good with its connection closed. Its cancellation handler
/// called `LoopbackClient.disconnect()`, which waited for the poll loop's thread to finish its
/// batch, while that thread, yielding a line to the very task being cancelled, waited for the
/// task's status lock, which the runtime holds while a cancellation handler runs.
@Suite("Loopback source cancellation")
struct LoopbackSourceCancellationTests {
    /// A TCP listener on 127.0.0.1 whose thread writes `IDLE` lines as fast as it can into its
    /// newest connection.
    private final class FloodingServer: Sendable {
        let port: UInt16
        private let listener: Int32
        private let stopped = Atomic<Bool>(false)
        private let exited = Atomic<Bool>(false)
        private let sentBytes = Atomic<Int>(0)
        var sent: Int { sentBytes.load(ordering: .relaxed) }

        init() throws {
            (listener, port) = try LoopbackSocket.listening(port: 0)
            let listener = self.listener
            KernelThread.spawn(name: "test-flood") { [self] in
                let line = Array("IDLE\n".utf8)
                var chunk: [UInt8] = []
                for _ in 0..<20 { chunk += line }
                var connection: Int32 = -1
                while !stopped.load(ordering: .acquiring) {
                    // Writes while the client reads; a new client waiting in the backlog replaces
                    // the current one (which may be gone: a socket its process closed can sit
                    // in the kernel with a full window, where a blocking send would wait for good).
                    var entries = [pollfd(fd: listener, events: Int16(POLLIN), revents: 0),
                                   pollfd(fd: connection, events: Int16(POLLOUT), revents: 0)]
                    guard poll(&entries, connection >= 0 ? 2 : 1, 100) > 0 else { continue }
                    if entries[0].revents != 0 {
                        if connection >= 0 { close(connection) }
                        connection = accept(listener, nil, nil)
                        if connection >= 0 { _ = fcntl(connection, F_SETFL, fcntl(connection, F_GETFL) | O_NONBLOCK) }
                        continue
                    }
                    if connection >= 0, entries[1].revents != 0 {
                        let count = send(connection, chunk, chunk.count, Int32(MSG_NOSIGNAL))
                        if count > 0 { sentBytes.add(count, ordering: .relaxed) }
                        if count < 0, errno != EAGAIN {
                            close(connection)
                            connection = -1
                        }
                        // In bursts, so that the client's handler runs often and briefly.
                        usleep(100)
                    }
                }
                if connection >= 0 { close(connection) }
                exited.store(true, ordering: .releasing)
            }
        }

        /// Stops the thread (within its 0.1 s poll) and closes the listener.
        func stop() {
            stopped.store(true, ordering: .releasing)
            while !exited.load(ordering: .acquiring) { usleep(1_000) }
            close(listener)
        }
    }

    /// This process's loopback, test and cooperative-pool threads, each with the kernel function
    /// it sleeps in (`wchan`; 0 when it runs): for a failure message, to tell a starved pool (a
    /// pool thread parked in a blocking read: `anon_pipe_read`) from a stuck poll loop.
    static func threadStates() -> String {
        ProcessThreads.all()
            .filter { $0.name.hasPrefix("loopback") || $0.name.hasPrefix("test-") || $0.name.contains("qos") }
            .map { "\($0.name)=\($0.waitChannel)" }
            .joined(separator: ", ")
    }

    @Test("a source cancelled while lines arrive ends at once, every time")
    func cancelledWhileLinesArrive() async throws {
        let server = try FloodingServer()
        defer { server.stop() }
        let connections = Atomic<Int>(0)
        let source = LoopbackMessageSource(port: server.port, onEvent: { event in
            if event == "source-connected" { connections.add(1, ordering: .relaxed) }
        })
        for round in 0..<2_000 {
            let ended = Atomic<Bool>(false)
            let idles = Atomic<Int>(0)
            let task = Task {
                defer { ended.store(true, ordering: .releasing) }
                try await source.run(epoch: 0, receive: { _ in }, isDone: {
                    idles.add(1, ordering: .relaxed)
                    return false
                })
            }
            // Cancelled while the poll thread hands it lines (it has had some).
            let start = ContinuousClock.now
            while idles.load(ordering: .relaxed) < 1 + round % 20 {
                guard ContinuousClock.now - start < .seconds(10) else {
                    // Say why: the run may have failed (its error), or never connected.
                    let how: String
                    if ended.load(ordering: .acquiring) {
                        do { try await task.value; how = "the run returned" } catch { how = "the run failed: \(error)" }
                    } else {
                        how = "the run is still going; \(connections.load(ordering: .relaxed)) connections made in \(round + 1) rounds"
                    }
                    throw TestFailure("round \(round): the source got no lines within 10 s (\(how)); sent \(server.sent) bytes; threads: \(Self.threadStates())")
                }
                try await Task.sleep(for: .microseconds(100))
            }
            // Cancelled from a thread of its own: the cancellation handler runs on the thread
            // that cancels, and a deadlock there must not take the test's own thread with it.
            KernelThread.spawn(name: "test-cancel") { task.cancel() }
            // A deadlock leaves the task hung for good: fail instead of waiting with it.
            let cancelled = ContinuousClock.now
            while !ended.load(ordering: .acquiring) {
                guard ContinuousClock.now - cancelled < .seconds(10) else {
                    Issue.record("round \(round): the cancelled source did not end within 10 s (its cancellation handler and the poll thread wait for each other)")
                    return
                }
                try await Task.sleep(for: .milliseconds(1))
            }
            await #expect(throws: CancellationError.self) { try await task.value }
        }
    }
}

