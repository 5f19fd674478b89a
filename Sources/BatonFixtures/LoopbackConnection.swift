import Baton
import CBatonShims
import Foundation
import Synchronization

/// A TCP client connection to a ``LoopbackServer``, as a ``SupervisedConnection``: the end of
/// the stream is noticed by a shared poll thread (no polling), `close()` shuts the socket down.
package final class LoopbackConnection: SupervisedConnection {
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
    private let state = Mutex<(closed: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    /// Connects to 127.0.0.1:`port` (a blocking connect: instant on loopback) and sends
    /// `hello NAME` when a name is given.
    /// - Throws: `systemCallFailed` (for example when the server refuses).
    package static func open(port: UInt16, name: String? = nil) throws -> LoopbackConnection {
        let fd = try connectSocket(port: port)
        if let name {
            let line = Array("hello \(name)\n".utf8)
            _ = send(fd, line, line.count, Int32(MSG_NOSIGNAL))
        }
        return try LoopbackConnection(fd: fd)
    }

    /// A connected socket (the raw primitive the benchmark compares against).
    package static func connectSocket(port: UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BatonError(.systemCallFailed, "socket() failed: errno \(errno)") }
        _ = baton_fcntl_int(fd, F_SETFD, FD_CLOEXEC)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else {
            let code = errno
            POSIX.close(fd)
            throw BatonError(.systemCallFailed, "connect to 127.0.0.1:\(port) failed: \(String(cString: strerror(code)))",
                             cause: SystemCallError(call: "connect", errno: code))
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        return fd
    }

    private init(fd: Int32) throws {
        self.fd = fd
        loop = try Self.sharedLoop()
        loop.add(fd, events: Int16(POLLIN) | 0x2000 /* POLLRDHUP */) { [weak self] _ in
            var buffer = [UInt8](repeating: 0, count: 512)
            while true {
                let count = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
                if count > 0 { continue }
                if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return true }
                if count < 0 && errno == EINTR { continue }
                self?.markClosed()
                return false
            }
        }
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
        let shut = loop.withRegistered { registered -> Bool in
            guard registered.contains(fd) && !isClosed else { return false }
            return shutdown(fd, Int32(SHUT_RDWR)) == 0
        }
        // After shutdown(2) the peer has its end of stream (loopback delivers the FIN within
        // the call); the poll thread still closes the descriptor when it sees the end.
        if shut { markClosed() }
        await closed()
    }

    package func ping() async throws {
        let sent = loop.withRegistered { registered -> Int in
            guard registered.contains(fd), !isClosed else { return -1 }
            var byte: UInt8 = 112 // "p"
            return send(fd, &byte, 1, Int32(MSG_NOSIGNAL))
        }
        if sent != 1 { throw BatonError(.systemCallFailed, "the keep-alive ping failed: the connection is gone") }
    }

    deinit {
        // `closed` is set before the loop removes and closes the descriptor, so while it is
        // false the number still names this connection's socket.
        loop.withRegistered { registered in
            if registered.contains(fd) && !isClosed { shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }
}
