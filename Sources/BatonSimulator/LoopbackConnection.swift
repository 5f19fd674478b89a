import Baton
import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// One connection of the app's core to the ``LoopbackServer``, as a `SupervisedConnection`
/// that a `ConnectionSupervisor` keeps up.
///
/// Each message the server sends is handed to `receive` (which stores it durably) and
/// acknowledged after `receive` returns; a message whose `receive` throws is not acknowledged
/// and the connection is closed, so the server delivers it again to the next core.
public final class LoopbackConnection: SupervisedConnection {
    private let fd: Int32
    private let state = Mutex<(closed: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    /// Connects and says `HELLO` with the role epoch it runs under.
    /// - Parameters:
    ///   - port: The server's port on 127.0.0.1.
    ///   - epoch: The epoch of the role grant this connection runs under.
    ///   - receive: Stores one message; called in order, one at a time.
    /// - Throws: `simulationFailed` when the server cannot be reached.
    public init(port: UInt16, epoch: UInt64, receive: @escaping @Sendable (ReceivedMessage) async throws -> Void) throws {
        fd = try LoopbackSocket.connect(port: port)
        guard LineReader.writeAll(fd, "HELLO \(getpid()) \(epoch)\n") else {
            POSIX.close(fd)
            throw BatonError(.simulationFailed, "the message server closed the connection at once")
        }
        ChildChannel.emit(.connected, epoch: epoch)
        // The reader thread receives lines, stores each message and acknowledges it, in order;
        // it blocks on the store, which is what keeps the acknowledgement after the write.
        let fd = self.fd
        LineReader.start(fd: fd, name: "sim-core", onLine: { [weak self] text in
            let fields = text.split(separator: " ", maxSplits: 3)
            guard fields.first == "MSG", fields.count == 4, let sent = UInt64(fields[2]) else { return }
            let message = ReceivedMessage(id: String(fields[1]), sent: sent, payload: String(fields[3]))
            if Self.blocking({ try await receive(message) }) {
                LineReader.writeAll(fd, "ACK \(message.id)\n")
            } else {
                self?.shutdownSocket()
            }
        }, onEnd: { [weak self] in
            ChildChannel.emit(.disconnected, epoch: epoch)
            POSIX.close(fd)
            self?.markClosed()
        })
    }

    /// Runs an async operation from the reader thread and waits for it; true when it succeeded.
    /// The one unstructured task of the module: a `SupervisedConnection` has no `run()` for the
    /// supervisor to drive, so the connection's own reader thread (a plain thread, never a
    /// thread of the concurrency pool) bridges each store into async code and blocks until it
    /// is durable, which keeps every acknowledgement after its store.
    private static func blocking(_ operation: @escaping @Sendable () async throws -> Void) -> Bool {
        let done = ThreadSemaphore()
        let result = Mutex(false)
        Task {
            do {
                try await operation()
                result.withLock { $0 = true }
            } catch {}
            done.signal()
        }
        done.wait()
        return result.withLock { $0 }
    }

    private func shutdownSocket() {
        if !state.withLock({ $0.closed }) { shutdown(fd, Int32(SHUT_RDWR)) }
    }

    private func markClosed() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.closed = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    public func closed() async {
        await withCheckedContinuation { continuation in
            let already = state.withLock { state -> Bool in
                if state.closed { return true }
                state.waiters.append(continuation)
                return false
            }
            if already { continuation.resume() }
        }
    }

    public func close() async {
        shutdownSocket()
        await closed()
    }

    public func ping() async throws {
        guard LineReader.writeAll(fd, "PING\n") else {
            throw BatonError(.lost, "the message server connection is gone")
        }
    }
}

/// A counting semaphore for a plain thread that waits on async work (pthread condition).
final class ThreadSemaphore: @unchecked Sendable {
    // @unchecked: `mutex` guards `count`; the condition is used only with it.
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var count = 0

    init() {
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&condition, nil)
    }

    deinit {
        pthread_cond_destroy(&condition)
        pthread_mutex_destroy(&mutex)
    }

    func signal() {
        pthread_mutex_lock(&mutex)
        count += 1
        pthread_cond_signal(&condition)
        pthread_mutex_unlock(&mutex)
    }

    func wait() {
        pthread_mutex_lock(&mutex)
        while count == 0 { pthread_cond_wait(&condition, &mutex) }
        count -= 1
        pthread_mutex_unlock(&mutex)
    }
}

/// A TCP connection to 127.0.0.1.
enum LoopbackSocket {
    static func connect(port: UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SimulatorError.system("socket", errno) }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = port.bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { POSIX.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard connected else {
            let number = errno
            POSIX.close(fd)
            throw SimulatorError.system("connect to 127.0.0.1:\(port)", number)
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        return fd
    }
}
