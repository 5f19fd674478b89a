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
///
/// The loop's own wake-up pipe lives as long as the object, not as long as the thread: any
/// holder of the loop may call ``wake()`` or ``stop()`` after the thread has ended, and the byte
/// it writes must land in this pipe, never in whatever descriptor reused a closed number (a
/// stray `0x01` at the start of a child process's output, or inside a file, was exactly that).
///
/// `@unchecked Sendable`: the state is behind its mutex; `rounds` is only touched atomically.
package final class PollLoop: @unchecked Sendable {
    package typealias Handler = @Sendable (_ revents: Int16) -> Bool

    private struct State {
        var handlers: [(fd: Int32, events: Int16, last: Bool, handler: Handler)] = []
        var removals: [Int32] = []
        /// Taken out of `handlers` and not closed yet.
        var closing: Set<Int32> = []
        var stopped = false
        /// The thread has returned: nothing registered later would ever be polled or closed.
        var exited = false
        /// The loop's thread, once it runs (a ``remove(_:)`` from a handler must not wait for it).
        var thread: pthread_t?
    }

    private let state = Mutex(State())
    private let wakeRead: Int32
    private let wakeWrite: Int32
    /// Bumped (and woken) by the thread after each round of removals and when it exits:
    /// ``remove(_:)`` sleeps on it in the kernel until its descriptor is gone.
    private let rounds: UnsafeMutablePointer<UInt32>
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
        rounds = .allocate(capacity: 1)
        rounds.initialize(to: 0)
        self.tick = tick
        KernelThread.spawn(name: name) { [self] in self.run() }
    }

    deinit {
        // The thread held a reference while it ran, and every caller of `wake()` holds one:
        // nobody can write to the pipe any more.
        close(wakeRead)
        close(wakeWrite)
        rounds.deallocate()
    }

    /// Registers `fd`; `handler` is called with the returned events. Descriptors registered
    /// with `handledLast` (a listening socket) are handled after the others of the same batch,
    /// so that the closes of old connections are recorded before the accepts of new ones.
    /// After ``stop()`` the descriptor is closed at once (the loop owns what it is given).
    package func add(_ fd: Int32, events: Int16 = Int16(POLLIN), handledLast: Bool = false, handler: @escaping Handler) {
        let accepted = state.withLock { state -> Bool in
            guard !state.stopped else {
                close(fd) // under the lock: `withRegistered` never sees the number reused
                return false
            }
            state.handlers.append((fd, events, handledLast, handler))
            return true
        }
        if accepted { wake() }
    }

    /// Runs `body` on the caller's thread while the loop cannot close any descriptor.
    package func withRegistered<R>(_ body: (_ registered: Set<Int32>) -> R) -> R {
        state.withLock { body(Set($0.handlers.map(\.fd))) }
    }

    /// Removes `fd` and closes it on the loop's thread; returns once that is done (sleeping in
    /// the kernel). From a handler (on the loop's thread) it returns at once, and the
    /// descriptor is closed before the next `poll(2)`.
    package func remove(_ fd: Int32) {
        let onLoopThread = state.withLock { state -> Bool in
            state.removals.append(fd)
            return state.thread.map { pthread_equal($0, pthread_self()) != 0 } ?? false
        }
        wake()
        guard !onLoopThread else { return }
        while true {
            let seen = baton_load32(rounds)
            let registered = state.withLock { state in
                !state.exited && (state.closing.contains(fd) || state.handlers.contains { $0.fd == fd })
            }
            guard registered else { return }
            _ = AddressWait.wait(on: rounds, expecting: seen, timeoutNanoseconds: -1)
        }
    }

    /// Stops the thread, which closes every registered descriptor. Safe to call more than once,
    /// and after the thread has ended.
    package func stop() {
        let first = state.withLock { state -> Bool in
            defer { state.stopped = true }
            return !state.stopped
        }
        if first { wake() }
    }

    /// Makes the loop call its tick soon. Harmless once the thread has ended (the pipe is
    /// still this object's).
    package func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    /// True once the thread has returned after ``stop()`` (for tests).
    package var hasExited: Bool { state.withLock { $0.exited } }

    /// Sleeps in the kernel until the thread has returned after ``stop()`` (for tests).
    package func waitUntilExited() {
        while true {
            let seen = baton_load32(rounds)
            if hasExited { return }
            _ = AddressWait.wait(on: rounds, expecting: seen, timeoutNanoseconds: -1)
        }
    }

    private func endRound() {
        baton_add32(rounds, 1)
        AddressWait.wakeAll(rounds)
    }

    private func run() {
        state.withLock { $0.thread = pthread_self() }
        var drain = [UInt8](repeating: 0, count: 256)
        var timeout: Int32 = -1
        while true {
            let (entries, removed, stopped) = state.withLock { state in
                let removed = state.handlers.filter { state.stopped || state.removals.contains($0.fd) }.map(\.fd)
                state.handlers.removeAll { removed.contains($0.fd) }
                state.removals.removeAll()
                state.closing.formUnion(removed)
                return (state.handlers, removed, state.stopped)
            }
            for fd in removed { close(fd) }
            if !removed.isEmpty || stopped {
                state.withLock { state in
                    state.closing.subtract(removed)
                    state.exited = stopped
                }
                endRound()
            }
            if stopped { return }
            var descriptors = entries.map { pollfd(fd: $0.fd, events: $0.events, revents: 0) }
            descriptors.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
            let ready = poll(&descriptors, nfds_t(descriptors.count), timeout)
            if ready < 0 { continue } // EINTR
            if descriptors.last!.revents != 0 { _ = read(wakeRead, &drain, drain.count) }
            let indices = Array(descriptors.indices.dropLast())
            let order = indices.filter { !entries[$0].last } + indices.filter { entries[$0].last }
            var closedHere = false
            for index in order where descriptors[index].revents != 0 {
                let entry = entries[index]
                if !entry.handler(descriptors[index].revents) {
                    state.withLock { state in
                        state.handlers.removeAll { $0.fd == entry.fd }
                        state.closing.insert(entry.fd)
                    }
                    close(entry.fd)
                    state.withLock { _ = $0.closing.remove(entry.fd) }
                    closedHere = true
                }
            }
            if closedHere { endRound() }
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
