import Baton
import CBatonShims
import Foundation
import Synchronization

/// A real TCP server on 127.0.0.1 for the lifecycle tests, benchmark and simulator: it accepts
/// connections, records every one (when it opened and closed, in one global order), drops them
/// on command, and can refuse new ones (it stops listening, so clients get `ECONNREFUSED`).
///
/// A client may send one line `hello NAME\n` to be named in the records; any other byte counts
/// as a keep-alive ping. It lives in BatonFixtures (not the library) because it is a test
/// fixture: `baton-harness lifecycle test-server` exposes it to other processes.
package final class LoopbackServer: Sendable {
    /// One connection the server saw.
    package struct Record: Sendable, Hashable, Codable {
        package var id: Int
        /// The name the client gave in its `hello` line, if any.
        package var name: String?
        /// CLOCK_MONOTONIC nanoseconds.
        package var openedAt: UInt64
        /// Position of the open in the server's global order of events.
        package var openedOrder: Int
        package var closedAt: UInt64?
        package var closedOrder: Int?
        /// `client` or `server`.
        package var closedBy: String?
        package var pings: Int = 0

        package var isOpen: Bool { closedAt == nil }
    }

    private struct State {
        var listener: Int32 = -1
        var refusing = false
        var records: [Record] = []
        var openByFD: [Int32: Int] = [:]
        var pending: [Int32: [UInt8]] = [:]
        var order = 0
    }

    /// The port it listens on.
    package let port: UInt16
    private let loop: PollLoop
    private let state = Mutex(State())

    /// Starts listening on 127.0.0.1 (an ephemeral port unless `port` is given).
    package init(port: UInt16 = 0) throws {
        loop = try PollLoop(name: "loopback-server")
        let listener = try Self.listen(port: port)
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        self.port = UInt16(bigEndian: address.sin_port)
        state.withLock { $0.listener = listener }
        register(listener: listener)
    }

    deinit { loop.stop() }

    package static func listen(port: UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BatonError(.systemCallFailed, "socket() failed: errno \(errno)") }
        _ = baton_fcntl_int(fd, F_SETFD, FD_CLOEXEC)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        var bound: Int32 = -1
        for _ in 0..<200 {
            bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            if bound == 0 || errno != EADDRINUSE { break }
            usleep(1_000) // the previous listener of this port is being closed
        }
        guard bound == 0, POSIX.listen(fd, 128) == 0 else {
            let code = errno
            close(fd)
            throw BatonError(.systemCallFailed, "bind/listen on 127.0.0.1:\(port) failed: errno \(code)")
        }
        _ = baton_fcntl_int(fd, F_SETFL, O_NONBLOCK)
        return fd
    }

    private func register(listener: Int32) {
        loop.add(listener, handledLast: true) { [weak self] _ in
            guard let self else { return false }
            while true {
                let client = POSIX.accept(listener, nil, nil)
                if client < 0 { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED }
                _ = baton_fcntl_int(client, F_SETFD, FD_CLOEXEC)
                _ = baton_fcntl_int(client, F_SETFL, O_NONBLOCK)
                var one: Int32 = 1
                setsockopt(client, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
                self.opened(client)
                // Read what is already queued before accepting the next connection: a client
                // that closed before a newer one connected is recorded closed before the newer
                // one opens, even when both wait in the backlog of one batch.
                if self.readable(client, 0) {
                    self.loop.add(client) { [weak self] revents in self?.readable(client, revents) ?? false }
                } else {
                    close(client)
                }
            }
        }
    }

    private func opened(_ fd: Int32) {
        let now = baton_monotonic_ns()
        state.withLock { state in
            state.order += 1
            let id = state.records.count
            state.records.append(Record(id: id, openedAt: now, openedOrder: state.order))
            state.openByFD[fd] = id
        }
    }

    /// Reads what the client sent; `false` when it closed.
    private func readable(_ fd: Int32, _ revents: Int16) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if count > 0 {
                received(fd, buffer[0..<count])
                continue
            }
            if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return true }
            if count < 0 && errno == EINTR { continue }
            closed(fd, by: "client")
            return false
        }
    }

    private func received(_ fd: Int32, _ bytes: ArraySlice<UInt8>) {
        state.withLock { state in
            guard let id = state.openByFD[fd] else { return }
            var pending = state.pending[fd, default: []] + bytes
            if state.records[id].name == nil, pending.starts(with: Array("hello ".utf8)) {
                guard let newline = pending.firstIndex(of: 10) else { state.pending[fd] = pending; return }
                state.records[id].name = String(decoding: pending[6..<newline], as: UTF8.self)
                pending.removeSubrange(...newline)
            }
            state.records[id].pings += pending.count
            state.pending[fd] = []
        }
    }

    private func closed(_ fd: Int32, by who: String) {
        let now = baton_monotonic_ns()
        state.withLock { state in
            guard let id = state.openByFD.removeValue(forKey: fd) else { return }
            state.pending[fd] = nil
            guard state.records[id].closedAt == nil else { return }
            state.order += 1
            state.records[id].closedAt = now
            state.records[id].closedOrder = state.order
            state.records[id].closedBy = who
        }
    }

    // MARK: Commands

    /// Every connection seen so far.
    package var records: [Record] { state.withLock { $0.records } }

    /// The connections open now.
    package var openConnections: [Record] { records.filter(\.isOpen) }

    /// Drops every open connection now (the clients see the end of the stream); returns how
    /// many were dropped.
    @discardableResult
    package func dropAll() -> Int {
        // Every client descriptor is closed only after `closed(_:by:)` removed it from
        // `openByFD` under this lock, so the descriptors listed there are still open.
        let now = baton_monotonic_ns()
        return state.withLock { state -> Int in
            var dropped = 0
            for (fd, id) in state.openByFD where state.records[id].closedAt == nil {
                shutdown(fd, Int32(SHUT_RDWR))
                state.order += 1
                state.records[id].closedAt = now
                state.records[id].closedOrder = state.order
                state.records[id].closedBy = "server"
                dropped += 1
            }
            return dropped
        }
    }

    /// Stops accepting: the port is closed, so connection attempts are refused.
    package func refuse() {
        let listener = state.withLock { state -> Int32 in
            defer { state.listener = -1; state.refusing = true }
            return state.listener
        }
        guard listener >= 0 else { return }
        loop.remove(listener)
    }

    /// Listens again on the same port.
    package func accept() throws {
        let needed = state.withLock { $0.listener < 0 }
        guard needed else { return }
        let listener = try Self.listen(port: port)
        state.withLock { state in
            state.listener = listener
            state.refusing = false
        }
        register(listener: listener)
    }

    /// Waits (polling every 2 ms, a test helper) until `predicate` holds for the records.
    @discardableResult
    package func waitUntil(timeout: Double = 20, _ predicate: ([Record]) -> Bool) async throws -> [Record] {
        let deadline = ContinuousClock.now.advanced(by: .milliseconds(Int64(timeout * 1000)))
        while true {
            let snapshot = records
            if predicate(snapshot) { return snapshot }
            if ContinuousClock.now >= deadline {
                throw BatonError(.timedOut, "the loopback server's records did not reach the expected state within \(timeout)s: \(snapshot)")
            }
            try await Task.sleep(for: .milliseconds(2))
        }
    }

    /// Whether no two connections were ever open at the same time, in the server's own order
    /// of events (a close and an accept seen in one batch are ordered close first).
    package static func neverOverlapped(_ records: [Record]) -> Bool {
        let sorted = records.sorted { $0.openedOrder < $1.openedOrder }
        for (previous, next) in zip(sorted, sorted.dropFirst()) {
            guard let closed = previous.closedOrder, closed < next.openedOrder else { return false }
        }
        return true
    }
}
