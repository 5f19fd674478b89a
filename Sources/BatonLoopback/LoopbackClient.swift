import Baton
import BatonSpawn
import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// The loopback fixture's client: one TCP connection to a ``LoopbackServer``, as a
/// `SupervisedConnection` a `ConnectionSupervisor` keeps up.
///
/// The end of the stream is noticed by a shared ``PollLoop`` thread (no polling); what the
/// server sends arrives in order on ``incoming``; ``close()`` shuts the socket down.
package final class LoopbackClient: SupervisedConnection {
    /// What a client says in `HELLO`.
    package struct Hello: Sendable {
        package var name: String
        package var pid: Int32
        package var epoch: UInt64

        /// `name` (no spaces), this process's pid, and the role epoch the connection runs under.
        package init(name: String, epoch: UInt64 = 0) {
            self.name = name
            self.pid = getpid()
            self.epoch = epoch
        }
    }

    private static let poller = Mutex<PollLoop?>(nil)

    private static func sharedLoop() throws -> PollLoop {
        try poller.withLock { loop in
            if let loop { return loop }
            let created = try PollLoop(name: "loopback-clients")
            loop = created
            return created
        }
    }

    private let fd: Int32
    private let loop: PollLoop
    /// The descriptor's registration in the loop (see ``PollLoop/shutDown(_:token:)``).
    /// (Stored once `add` returns; the handler, which captures `self`, is made before.)
    private let registration = Atomic<UInt64>(0)
    private let continuation: AsyncStream<LoopbackLine>.Continuation
    private let state = Mutex<(closed: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    /// The lines the server sends (`MSG`, `IDLE`, replies), in order; finished at the end of
    /// the stream.
    package let incoming: AsyncStream<LoopbackLine>

    /// Connects to 127.0.0.1:`port` and says `HELLO` when `hello` is given.
    /// - Throws: `systemCallFailed` (for example when the server refuses).
    package init(port: UInt16, hello: Hello? = nil) throws {
        handOverTrace("client.connect")
        fd = try LoopbackSocket.connected(port: port)
        handOverTrace("client.connectd")
        if let hello {
            LoopbackSocket.write(fd, LoopbackLine.hello(name: hello.name, pid: hello.pid, epoch: hello.epoch).text)
        }
        handOverTrace("client.hello")
        loop = try Self.sharedLoop()
        let (incoming, continuation) = AsyncStream.makeStream(of: LoopbackLine.self)
        self.incoming = incoming
        self.continuation = continuation
        let fd = self.fd
        let splitter = Mutex(LineSplitter())
        defer { handOverTrace("client.added") }
        let token = try loop.add(fd, events: Int16(POLLIN) | 0x2000 /* POLLRDHUP */) { [weak self] _ in
            var buffer = [UInt8](repeating: 0, count: 16_384)
            while true {
                let count = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
                if count > 0 {
                    for line in splitter.withLock({ $0.append(buffer[0..<count]) }) {
                        if let parsed = LoopbackLine(line) { continuation.yield(parsed) }
                    }
                    continue
                }
                if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return true }
                if count < 0 && errno == EINTR { continue }
                continuation.finish()
                self?.markClosed()
                return false
            }
        }
        registration.store(token, ordering: .releasing)
    }

    private func markClosed() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.closed = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    package var isClosed: Bool { state.withLock { $0.closed } }

    /// Sends one line; false when the connection is gone.
    @discardableResult
    package func send(_ line: LoopbackLine) -> Bool {
        loop.withRegistered { registered -> Bool in
            guard registered.contains(fd), !isClosed else { return false }
            return LoopbackSocket.write(fd, line.text)
        }
    }

    /// Shuts the socket down and closes it (the peer has its end of stream when this returns:
    /// loopback delivers the FIN within the call). The descriptor leaves the poll loop's set
    /// first, so that the loop's thread is not woken by this socket's own hang-up.
    package func disconnect() {
        handOverTrace("client.close")
        guard !isClosed, loop.remove(fd, shuttingDown: true) else { return }
        handOverTrace("client.closed")
        continuation.finish()
        markClosed()
    }

    /// Shuts the socket down without waiting for anything (the peer has its end of stream; this
    /// side's ``incoming`` finishes once the poll loop's thread sees it): the way to end the
    /// connection from a task's cancellation handler. ``disconnect()`` may wait there for the
    /// loop's thread, which may be resuming that very task and then needs the lock the runtime
    /// holds while the handler runs: both wait forever (seen in the inbox benchmark under load:
    /// a cancelled ``LoopbackMessageSource`` whose server had just sent a line).
    package func shutDown() {
        loop.shutDown(fd, token: registration.load(ordering: .acquiring))
    }

    package func closed() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let already = state.withLock { state -> Bool in
                if state.closed { return true }
                state.waiters.append(continuation)
                return false
            }
            if already { continuation.resume() }
        }
    }

    package func close() async {
        disconnect()
        // Closed by the disconnect (or before): no suspension, so no hand-off to another thread.
        if isClosed { return }
        await closed()
    }

    package func ping() async throws {
        guard send(.ping) else { throw BatonError(.lost, "the keep-alive ping failed: the connection is gone") }
    }

    /// Sends one command (`PUSH`, `STATS`, `DELAY`) on a fresh connection and returns the reply
    /// line (blocking).
    package static func command(_ line: LoopbackLine, port: UInt16) throws -> String {
        let fd = try LoopbackSocket.connected(port: port)
        defer { POSIX.close(fd) }
        guard LoopbackSocket.write(fd, line.text) else {
            throw BatonError(.lost, "the loopback server on port \(port) closed the connection")
        }
        var reply: [UInt8] = []
        var byte: UInt8 = 0
        while read(fd, &byte, 1) == 1 {
            if byte == 10 { break }
            reply.append(byte)
        }
        return String(decoding: reply, as: UTF8.self)
    }

    deinit {
        // While `closed` is false the socket is still in the loop's set (the handler sets it
        // before it gives the descriptor back, `disconnect` after the removal), and `remove`
        // acts only on a registered number.
        disconnect()
    }
}
