import Baton
import CBatonShims
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// A tiny message server on 127.0.0.1 for the inbox's tests and benchmark: it holds pushed
/// messages and delivers them to every connected core until one acknowledges them.
///
/// Line protocol (one command per line, fields separated by one space, payloads in hex):
/// ```
/// client -> server   PUSH <id> <hex>   store a message (a known id is ignored)   -> OK
///                    STATS             -> STATS cores=N fetches=N pushes=N acked=N pending=N
///                    DELAY <ms>        wait this long before each delivery        -> OK
///                    CORE              this connection is a core: it receives
/// server -> core     MSG <id> <hex>    every pending message (then each new push)
///                    IDLE              after the last pending one was sent
/// core -> server     ACK <id>          stored: the server forgets the message
/// ```
/// `cores` counts core connections ever made (how many times a source ran), `fetches` the
/// messages sent to cores. A message a core received but did not acknowledge (the core was
/// killed) stays pending and goes to the next core.
///
/// Single-threaded: one `poll(2)` loop, blocking until a socket is ready or a delayed delivery
/// is due. Test-only: the `BatonLoopback` target is not a product.
package final class LoopbackMessageServer {
    private struct Connection {
        var fd: Int32
        var input: [UInt8] = []
        var output: [UInt8] = []
        var isCore = false
        var queue: [String] = []
        var owesIdle = false
        var nextSend: UInt64 = 0
    }

    private let listener: Int32
    package let port: UInt16
    private var connections: [Int32: Connection] = [:]
    private var pending: [String: String] = [:]
    private var pendingOrder: [String] = []
    private var delayNanoseconds: UInt64
    private var cores = 0, fetches = 0, pushes = 0, acked = 0

    package init(delayMilliseconds: Int) throws {
        delayNanoseconds = UInt64(max(0, delayMilliseconds)) * 1_000_000
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw BatonError(.systemCallFailed, "socket() failed: errno \(errno)") }
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 128) == 0 else {
            close(fd)
            throw BatonError(.systemCallFailed, "bind/listen on 127.0.0.1 failed: errno \(errno)")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        listener = fd
        port = UInt16(bigEndian: address.sin_port)
    }

    /// Serves until the process is killed.
    package func serve() -> Never {
        while true {
            var fds = [pollfd(fd: listener, events: Int16(POLLIN), revents: 0)]
            for connection in connections.values {
                var events = Int16(POLLIN)
                if !connection.output.isEmpty { events |= Int16(POLLOUT) }
                fds.append(pollfd(fd: connection.fd, events: events, revents: 0))
            }
            let timeout = nextTimeoutMilliseconds()
            let ready = poll(&fds, nfds_t(fds.count), timeout)
            if ready < 0 && errno != EINTR {
                let message = Array("loopback server: poll failed: errno \(errno)\n".utf8)
                _ = message.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
                exit(2)
            }
            if ready > 0 {
                if fds[0].revents & Int16(POLLIN) != 0 { acceptConnection() }
                for entry in fds.dropFirst() where entry.revents != 0 {
                    if entry.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 { readFrom(entry.fd) }
                    if entry.revents & Int16(POLLOUT) != 0 { flush(entry.fd) }
                }
            }
            pump()
        }
    }

    private func nextTimeoutMilliseconds() -> Int32 {
        let now = baton_monotonic_ns()
        var soonest: UInt64?
        for connection in connections.values where connection.isCore && (!connection.queue.isEmpty || connection.owesIdle) {
            soonest = min(soonest ?? .max, connection.nextSend)
        }
        guard let soonest else { return -1 }
        return soonest <= now ? 0 : Int32(min((soonest - now) / 1_000_000 + 1, 60_000))
    }

    private func acceptConnection() {
        let fd = accept(listener, nil, nil)
        guard fd >= 0 else { return }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        connections[fd] = Connection(fd: fd)
    }

    private func drop(_ fd: Int32) {
        close(fd)
        connections[fd] = nil
    }

    private func readFrom(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else {
            if count == 0 || (errno != EINTR && errno != EAGAIN) { drop(fd) }
            return
        }
        connections[fd]?.input.append(contentsOf: buffer[0..<count])
        while let connection = connections[fd], let newline = connection.input.firstIndex(of: 10) {
            let line = String(decoding: connection.input[..<newline], as: UTF8.self)
            connections[fd]?.input.removeSubrange(...newline)
            handle(line, from: fd)
        }
    }

    private func send(_ line: String, to fd: Int32) {
        connections[fd]?.output.append(contentsOf: Array((line + "\n").utf8))
        flush(fd)
    }

    private func flush(_ fd: Int32) {
        guard var connection = connections[fd], !connection.output.isEmpty else { return }
        let written = connection.output.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if written > 0 {
            connection.output.removeFirst(written)
            connections[fd] = connection
        } else if errno != EAGAIN && errno != EINTR {
            drop(fd)
        }
    }

    private func handle(_ line: String, from fd: Int32) {
        let fields = line.split(separator: " ", omittingEmptySubsequences: false).map(String.init)
        switch fields.first {
        case "PUSH" where fields.count == 3:
            pushes += 1
            let id = fields[1]
            if pending[id] == nil {
                pending[id] = fields[2]
                pendingOrder.append(id)
                for key in Array(connections.keys) where connections[key]?.isCore == true {
                    connections[key]?.queue.append(id)
                    connections[key]?.owesIdle = true
                }
            }
            send("OK", to: fd)
        case "STATS":
            send("STATS cores=\(cores) fetches=\(fetches) pushes=\(pushes) acked=\(acked) pending=\(pending.count)", to: fd)
        case "DELAY" where fields.count == 2:
            delayNanoseconds = UInt64(max(0, Int(fields[1]) ?? 0)) * 1_000_000
            send("OK", to: fd)
        case "CORE":
            cores += 1
            connections[fd]?.isCore = true
            connections[fd]?.queue = pendingOrder.filter { pending[$0] != nil }
            connections[fd]?.owesIdle = true
            connections[fd]?.nextSend = baton_monotonic_ns() + delayNanoseconds
        case "ACK" where fields.count == 2:
            if pending.removeValue(forKey: fields[1]) != nil {
                acked += 1
                pendingOrder.removeAll { $0 == fields[1] }
            }
        default:
            send("ERROR unknown command", to: fd)
        }
    }

    /// Sends what is due to each core: one message per delay, then IDLE.
    private func pump() {
        let now = baton_monotonic_ns()
        for fd in Array(connections.keys) {
            guard var connection = connections[fd], connection.isCore, connection.nextSend <= now else { continue }
            while let id = connection.queue.first, pending[id] == nil { connection.queue.removeFirst() }
            if let id = connection.queue.first, let payload = pending[id] {
                connection.queue.removeFirst()
                connection.nextSend = now + delayNanoseconds
                connections[fd] = connection
                fetches += 1
                send("MSG \(id) \(payload)", to: fd)
                continue
            }
            if connection.owesIdle {
                connection.owesIdle = false
                connections[fd] = connection
                send("IDLE", to: fd)
            }
        }
    }
}

/// Hex for the loopback protocol.
package enum Hex {
    package static func encode(_ bytes: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 15)])
        }
        return out.isEmpty ? "-" : String(decoding: out, as: UTF8.self)
    }

    package static func decode(_ text: String) -> [UInt8]? {
        if text == "-" { return [] }
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case 48...57: return c - 48
            case 97...102: return c - 87
            case 65...70: return c - 55
            default: return nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(chars.count / 2)
        var index = 0
        while index < chars.count {
            guard let high = value(chars[index]), let low = value(chars[index + 1]) else { return nil }
            out.append(high << 4 | low)
            index += 2
        }
        return out
    }
}
