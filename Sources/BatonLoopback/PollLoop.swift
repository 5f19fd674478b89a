import Baton
import BatonSpawn
import CBatonHarness
import CBatonShims
import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// One thread blocked in `poll(2)` over a changing set of descriptors: the one I/O model of the
/// loopback server and its clients. Handlers run on that thread; a handler that returns `false`
/// has its descriptor removed and closed by the loop (only the loop closes registered
/// descriptors, so a descriptor number is never reused while another thread may still act on it).
package final class PollLoop: Sendable {
    package typealias Handler = @Sendable (_ revents: Int16) -> Bool

    private struct State {
        var handlers: [(fd: Int32, events: Int16, last: Bool, handler: Handler)] = []
        var removals: [Int32] = []
        var stopped = false
    }

    private let state = Mutex(State())
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let tick: (@Sendable () -> Int32)?

    /// Starts the thread.
    /// - Parameters:
    ///   - name: The thread's name.
    ///   - tick: Called on the loop's thread after every wake-up; returns how long the next
    ///     `poll(2)` may wait (milliseconds, -1 for no limit): the loop's timer.
    package init(name: String, tick: (@Sendable () -> Int32)? = nil) throws {
        var ends: [Int32] = [-1, -1]
        guard baton_pipe_cloexec(&ends, 1) == 0 else {
            throw BatonError(.systemCallFailed, "pipe2 failed", cause: SystemCallError(call: "pipe2", errno: errno))
        }
        wakeRead = ends[0]
        wakeWrite = ends[1]
        self.tick = tick
        KernelThread.spawn(name: name) { [self] in self.run() }
    }

    /// Registers `fd`; `handler` is called with the returned events. Descriptors registered
    /// with `handledLast` (a listening socket) are handled after the others of the same batch,
    /// so that the closes of old connections are recorded before the accepts of new ones.
    package func add(_ fd: Int32, events: Int16 = Int16(POLLIN), handledLast: Bool = false, handler: @escaping Handler) {
        state.withLock { $0.handlers.append((fd, events, handledLast, handler)) }
        wake()
    }

    /// Runs `body` on the caller's thread while the loop cannot close any descriptor.
    package func withRegistered<R>(_ body: (_ registered: Set<Int32>) -> R) -> R {
        state.withLock { body(Set($0.handlers.map(\.fd))) }
    }

    /// Removes `fd` and closes it on the loop's thread; returns once that is done.
    package func remove(_ fd: Int32) {
        state.withLock { $0.removals.append(fd) }
        wake()
        while state.withLock({ $0.handlers.contains { $0.fd == fd } }) { usleep(50) }
    }

    /// Stops the thread and closes every registered descriptor.
    package func stop() {
        state.withLock { $0.stopped = true }
        wake()
    }

    /// Makes the loop call its tick soon.
    package func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    private func run() {
        var drain = [UInt8](repeating: 0, count: 256)
        var timeout: Int32 = -1
        while true {
            let (entries, removed, stopped) = state.withLock { state in
                let removed = state.handlers.filter { state.stopped || state.removals.contains($0.fd) }.map(\.fd)
                state.handlers.removeAll { removed.contains($0.fd) }
                state.removals.removeAll()
                return (state.handlers, removed, state.stopped)
            }
            for fd in removed { close(fd) }
            if stopped {
                close(wakeRead)
                close(wakeWrite)
                return
            }
            var descriptors = entries.map { pollfd(fd: $0.fd, events: $0.events, revents: 0) }
            descriptors.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
            let ready = poll(&descriptors, nfds_t(descriptors.count), timeout)
            if ready < 0 { continue } // EINTR
            if descriptors.last!.revents != 0 { _ = read(wakeRead, &drain, drain.count) }
            let indices = Array(descriptors.indices.dropLast())
            let order = indices.filter { !entries[$0].last } + indices.filter { entries[$0].last }
            for index in order where descriptors[index].revents != 0 {
                let entry = entries[index]
                if !entry.handler(descriptors[index].revents) {
                    state.withLock { state in state.handlers.removeAll { $0.fd == entry.fd } }
                    close(entry.fd)
                }
            }
            timeout = tick?() ?? -1
        }
    }
}

/// TCP sockets on 127.0.0.1, close-on-exec from their creation.
package enum LoopbackSocket {
    /// A listening socket on 127.0.0.1:`port` (0: an ephemeral port), non-blocking.
    package static func listening(port: UInt16) throws -> (fd: Int32, port: UInt16) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure("socket", errno) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = loopback(port: port)
        var bound: Int32 = -1
        for _ in 0..<200 {
            bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            if bound == 0 || errno != EADDRINUSE { break }
            usleep(1_000) // the previous listener of this port is being closed
        }
        guard bound == 0, listen(fd, 128) == 0 else {
            let code = errno
            close(fd)
            throw failure("bind/listen on 127.0.0.1:\(port)", code)
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        _ = baton_fcntl_int(fd, F_SETFL, O_NONBLOCK)
        return (fd, UInt16(bigEndian: address.sin_port))
    }

    /// A socket connected to 127.0.0.1:`port` (a blocking connect: instant on loopback), with
    /// `TCP_NODELAY`: also the raw primitive the lifecycle benchmark compares against.
    /// - Throws: `systemCallFailed` (for example when the server refuses).
    package static func connected(port: UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw failure("socket", errno) }
        var address = loopback(port: port)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else {
            let code = errno
            close(fd)
            throw failure("connect to the loopback server on 127.0.0.1:\(port)", code)
        }
        noDelay(fd)
        return fd
    }

    package static func noDelay(_ fd: Int32) {
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    /// Writes all of `text` (waiting while a non-blocking socket is full); false when the peer is gone.
    @discardableResult
    package static func write(_ fd: Int32, _ text: String) -> Bool { LineReader.writeAll(fd, text) }

    private static func loopback(port: UInt16) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        return address
    }

    private static func failure(_ call: String, _ code: Int32) -> BatonError {
        BatonError(.systemCallFailed, "\(call) failed: \(String(cString: strerror(code)))",
                   cause: SystemCallError(call: call, errno: code))
    }
}
