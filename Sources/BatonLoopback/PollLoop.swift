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

/// One thread waiting on a changing set of descriptors: the one I/O model of the loopback
/// server and its clients. Handlers run on that thread; a handler that returns `false` has its
/// descriptor removed and closed by the loop. Only the loop closes registered descriptors, and
/// never while a handler of its current batch may still act on one, so a descriptor number is
/// not reused under another thread's feet.
///
/// On Linux the thread waits in `epoll_wait`, and ``add(_:events:handledLast:handler:)`` and
/// ``remove(_:)`` change the set from the caller's thread without waking it: a connection made,
/// or dropped, costs no second thread's wake-up (on a machine whose idle processors halt, each
/// costs the waker 15-20 µs in its system call). Elsewhere (``Backend/poll``, which Linux tests
/// too) the thread rebuilds a `poll(2)` set each round, and a change wakes it.
///
/// The loop's own wake-up pipe lives as long as the object, not as long as the thread: any
/// holder of the loop may call ``wake()`` or ``stop()`` after the thread has ended, and the byte
/// it writes must land in this pipe, never in whatever descriptor reused a closed number (a
/// stray `0x01` at the start of a child process's output, or inside a file, was exactly that).
///
/// `@unchecked Sendable`: the state is behind its mutex; `rounds` is only touched atomically;
/// the descriptors are set once.
package final class PollLoop: @unchecked Sendable {
    package typealias Handler = @Sendable (_ revents: Int16) -> Bool

    /// How the thread waits.
    package enum Backend: Sendable {
        /// `epoll` (Linux): the set changes without waking the thread.
        case epoll
        /// `poll(2)`: the thread rebuilds its set each round; a change wakes it.
        case poll

        /// `epoll` on Linux, `poll` elsewhere.
        package static var platformDefault: Backend {
            #if os(Linux)
            .epoll
            #else
            .poll
            #endif
        }
    }

    private struct Entry {
        var fd: Int32
        var events: Int16
        var last: Bool
        /// The descriptor in the low 32 bits, a serial above: an event reported for a number
        /// that was closed and registered again since is recognised and dropped.
        var token: UInt64
        var handler: Handler
    }

    private struct State {
        var entries: [Int32: Entry] = [:]
        var serial: UInt64 = 0
        /// `poll` backend: removals for the thread to make.
        var removals: [Int32] = []
        /// Out of `entries`, not closed yet (closed by the thread at the end of its batch).
        var closing: Set<Int32> = []
        /// The thread runs handlers: a removal closes at the end of the batch, not at once.
        var dispatching = false
        var stopped = false
        /// The thread has returned: nothing registered later would ever be polled or closed.
        var exited = false
        /// The loop's thread, once it runs.
        var thread: pthread_t?
        /// How many times the thread's wait returned (for tests).
        var waits: UInt64 = 0

        func isLoopThread() -> Bool { thread.map { pthread_equal($0, pthread_self()) != 0 } ?? false }
    }

    /// The token of the wake-up pipe's events.
    private static let wakeToken: UInt64 = 0

    package let backend: Backend
    private let state = Mutex(State())
    private let wakeRead: Int32
    private let wakeWrite: Int32
    /// The epoll instance (`-1` with the `poll` backend).
    private let epoll: Int32
    /// Bumped (and woken) by the thread after each batch that closed descriptors, and when it
    /// exits: ``remove(_:)`` and ``waitUntilExited()`` sleep on it in the kernel.
    private let rounds: UnsafeMutablePointer<UInt32>
    private let tick: (@Sendable () -> Int32)?

    /// Starts the thread.
    /// - Parameters:
    ///   - name: The thread's name.
    ///   - backend: How it waits (``Backend/platformDefault`` unless a test says otherwise).
    ///   - tick: Called on the loop's thread after every wake-up; returns how long the next
    ///     wait may last (milliseconds, -1 for no limit): the loop's timer.
    ///   - preemptsOnWake: `false` makes the thread `SCHED_BATCH` on Linux (nothing elsewhere):
    ///     its wake-ups wait for a free processor, or the next tick, instead of preempting a
    ///     running thread. For a loop that stands in for another machine in a benchmark.
    /// - Throws: `systemCallFailed` when the pipe or the epoll instance cannot be made.
    package init(name: String, backend: Backend = .platformDefault, preemptsOnWake: Bool = true, tick: (@Sendable () -> Int32)? = nil) throws {
        var ends: [Int32] = [-1, -1]
        guard baton_pipe_cloexec(&ends, 1) == 0 else {
            throw BatonError(.systemCallFailed, "pipe2 failed", cause: SystemCallError(call: "pipe2", errno: errno))
        }
        var epoll: Int32 = -1
        if backend == .epoll {
            epoll = baton_epoll_create()
            guard epoll >= 0, baton_epoll_add(epoll, ends[0], UInt32(POLLIN), Self.wakeToken) == 0 else {
                let code = errno
                if epoll >= 0 { close(epoll) }
                close(ends[0])
                close(ends[1])
                throw BatonError(.systemCallFailed, "epoll_create1 failed", cause: SystemCallError(call: "epoll_create1", errno: code))
            }
        }
        self.backend = backend
        self.epoll = epoll
        wakeRead = ends[0]
        wakeWrite = ends[1]
        rounds = .allocate(capacity: 1)
        rounds.initialize(to: 0)
        self.tick = tick
        KernelThread.spawn(name: name) { [self] in
            // A refusal (not Linux) leaves the thread as it was.
            if !preemptsOnWake { _ = baton_harness_batch_thread() }
            self.run()
        }
    }

    deinit {
        // The thread held a reference while it ran, and every caller of `wake()` holds one:
        // nobody can use these any more.
        close(wakeRead)
        close(wakeWrite)
        if epoll >= 0 { close(epoll) }
        rounds.deallocate()
    }

    /// Registers `fd`; `handler` is called on the loop's thread with the returned events.
    /// Descriptors registered with `handledLast` (a listening socket) are handled after the
    /// others of the same batch, so that the closes of old connections are recorded before the
    /// accepts of new ones. The loop owns `fd` from now on: after ``stop()``, or when it cannot
    /// be watched, it is closed at once.
    /// - Returns: The registration's token (for ``shutDown(_:token:)``); 0 when the loop had
    ///   stopped (the descriptor is closed).
    /// - Throws: `systemCallFailed` when epoll refuses the descriptor (it is closed).
    @discardableResult
    package func add(_ fd: Int32, events: Int16 = Int16(POLLIN), handledLast: Bool = false, handler: @escaping Handler) throws -> UInt64 {
        var token: UInt64 = 0
        let wakeNeeded = try state.withLock { state -> Bool in
            guard !state.stopped else {
                close(fd) // under the lock: `withRegistered` never sees the number reused
                return false
            }
            state.serial &+= 1
            token = UInt64(UInt32(bitPattern: fd)) | (state.serial << 32)
            if backend == .epoll, baton_epoll_add(epoll, fd, UInt32(UInt16(bitPattern: events)), token) != 0 {
                let code = errno
                close(fd)
                throw BatonError(.systemCallFailed, "epoll_ctl(EPOLL_CTL_ADD) of a loopback socket failed: \(String(cString: strerror(code)))",
                                 cause: SystemCallError(call: "epoll_ctl", errno: code))
            }
            state.entries[fd] = Entry(fd: fd, events: events, last: handledLast, token: token, handler: handler)
            // A `poll` thread must rebuild its set; from a handler it does so after the batch.
            return backend == .poll && !state.isLoopThread()
        }
        if wakeNeeded { wake() }
        return token
    }

    /// Shuts the socket of registration `token` down (`shutdown(2)`, both directions) if it is
    /// still registered, and returns at once: its handler then sees the end of the stream on
    /// the loop's thread, and the loop removes and closes it as usual.
    ///
    /// Unlike ``remove(_:shuttingDown:)``, it never waits for the loop's thread, so it is safe
    /// where waiting is not: in a task's cancellation handler, which runs while the runtime
    /// holds that task's status lock. A handler that resumes the same task at that moment (a
    /// stream's `yield`) needs that lock, and a `remove` waiting for the handler's batch to end
    /// would wait forever.
    package func shutDown(_ fd: Int32, token: UInt64) {
        state.withLock { state in
            // Under the lock, and only for this very registration: the number may have been
            // closed and registered again since.
            guard state.entries[fd]?.token == token else { return }
            shutdown(fd, Int32(SHUT_RDWR))
        }
    }

    /// Runs `body` on the caller's thread while the loop cannot close any descriptor.
    package func withRegistered<R>(_ body: (_ registered: Set<Int32>) -> R) -> R {
        state.withLock { body(Set($0.entries.keys)) }
    }

    /// Removes `fd` and closes it; returns once it is closed (sleeping in the kernel while the
    /// loop's thread finishes a batch of handlers, or, with the `poll` backend, rebuilds its
    /// set). From a handler (on the loop's thread) it returns at once, and the descriptor is
    /// closed at the end of the batch. A descriptor that is not registered is left alone.
    /// - Parameter shuttingDown: `shutdown(2)` the socket first (its peer sees the end of the
    ///   stream at once); with epoll the descriptor leaves the set before, so that the loop's
    ///   thread is not woken by its own socket's hang-up.
    /// - Returns: Whether `fd` was registered (and is now closed, or being closed).
    @discardableResult
    package func remove(_ fd: Int32, shuttingDown: Bool = false) -> Bool {
        let (registered, wait, wakeNeeded) = state.withLock { state -> (Bool, Bool, Bool) in
            guard !state.exited else { return (false, false, false) }
            guard state.entries[fd] != nil else { return (false, state.closing.contains(fd) && !state.isLoopThread(), false) }
            let onLoopThread = state.isLoopThread()
            switch backend {
            case .epoll:
                takeOut(fd, &state)
                handOverTrace("poll.removed")
                if shuttingDown { shutdown(fd, Int32(SHUT_RDWR)) }
                handOverTrace("poll.shutdown")
                if state.dispatching { return (true, !onLoopThread, false) }
                close(fd)
                handOverTrace("poll.closed")
                state.closing.remove(fd)
                return (true, false, false)
            case .poll:
                if shuttingDown { shutdown(fd, Int32(SHUT_RDWR)) }
                state.removals.append(fd)
                return (true, !onLoopThread, !onLoopThread)
            }
        }
        if wakeNeeded { wake() }
        if wait {
            waitForRounds { $0.exited || !($0.closing.contains(fd) || $0.entries[fd] != nil) }
        }
        return registered
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

    /// How many times the thread's `epoll_wait` or `poll(2)` returned so far (for tests: with
    /// epoll, adding and removing descriptors does not wake the thread).
    package var waits: UInt64 { state.withLock { $0.waits } }

    /// True once the thread has returned after ``stop()`` (for tests).
    package var hasExited: Bool { state.withLock { $0.exited } }

    /// Sleeps in the kernel until the thread has returned after ``stop()`` (for tests).
    package func waitUntilExited() {
        waitForRounds { $0.exited }
    }

    /// Takes `fd` out of the set (and out of epoll's) into `closing`: closed by the thread at
    /// the end of its batch (``finishClosing(_:)``), or by the caller under the same lock.
    private func takeOut(_ fd: Int32, _ state: inout State) {
        state.entries[fd] = nil
        if backend == .epoll { _ = baton_epoll_remove(epoll, fd) }
        state.closing.insert(fd)
    }

    /// Sleeps in the kernel until `done` holds, looking again after each round of the thread.
    private func waitForRounds(until done: (State) -> Bool) {
        while true {
            let seen = baton_load32(rounds)
            if state.withLock({ done($0) }) { return }
            _ = AddressWait.wait(on: rounds, expecting: seen, timeoutNanoseconds: -1)
        }
    }

    private func endRound() {
        baton_add32(rounds, 1)
        AddressWait.wakeAll(rounds)
    }

    // MARK: The thread

    private func run() {
        state.withLock { $0.thread = pthread_self() }
        var drain = [UInt8](repeating: 0, count: 256)
        var timeout: Int32 = -1
        var tokens = [UInt64](repeating: 0, count: 64)
        var events = [UInt32](repeating: 0, count: 64)
        while true {
            // `poll` backend: the removals asked for since the last round, closed before the
            // set is rebuilt.
            if backend == .poll {
                let removed = state.withLock { state -> [Int32] in
                    let removed = state.removals.filter { state.entries[$0] != nil }
                    for fd in removed { takeOut(fd, &state) }
                    state.removals.removeAll()
                    return removed
                }
                finishClosing(removed)
            }
            let count: Int
            switch backend {
            case .epoll:
                count = tokens.withUnsafeMutableBufferPointer { tokens in
                    events.withUnsafeMutableBufferPointer { events in
                        Int(baton_epoll_wait(epoll, tokens.baseAddress, events.baseAddress, Int32(tokens.count), timeout))
                    }
                }
            case .poll:
                let entries = state.withLock { Array($0.entries.values) }
                var descriptors = entries.map { pollfd(fd: $0.fd, events: $0.events, revents: 0) }
                descriptors.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
                let ready = poll(&descriptors, nfds_t(descriptors.count), timeout)
                var found = 0
                if ready > 0 {
                    for (index, descriptor) in descriptors.enumerated() where descriptor.revents != 0 {
                        if found == tokens.count { break }
                        tokens[found] = index == entries.count ? Self.wakeToken : entries[index].token
                        events[found] = UInt32(UInt16(bitPattern: descriptor.revents))
                        found += 1
                    }
                }
                count = ready < 0 ? -1 : found
            }
            if count < 0 { continue } // EINTR
            // The batch, as registered now: an event of a descriptor removed (or closed and
            // registered again) since the wait began is dropped.
            var wakePipe = false
            let (batch, stopped) = state.withLock { state -> ([(Entry, Int16)], Bool) in
                state.waits += 1
                var batch: [(Entry, Int16)] = []
                for index in 0..<count {
                    if tokens[index] == Self.wakeToken { wakePipe = true; continue }
                    let fd = Int32(bitPattern: UInt32(truncatingIfNeeded: tokens[index]))
                    if let entry = state.entries[fd], entry.token == tokens[index] {
                        batch.append((entry, Int16(truncatingIfNeeded: events[index])))
                    }
                }
                if !state.stopped { state.dispatching = true }
                return (batch, state.stopped)
            }
            if wakePipe { _ = read(wakeRead, &drain, drain.count) }
            if stopped {
                let all = state.withLock { state -> [Int32] in
                    let all = Array(state.entries.keys)
                    for fd in all { takeOut(fd, &state) }
                    return all
                }
                finishClosing(all)
                state.withLock { $0.exited = true }
                endRound()
                return
            }
            for (entry, revents) in batch.filter({ !$0.0.last }) + batch.filter({ $0.0.last }) {
                // An earlier handler of this batch, or another thread, may have removed it.
                guard state.withLock({ $0.entries[entry.fd]?.token == entry.token }) else { continue }
                if !entry.handler(revents) {
                    state.withLock { state in
                        if state.entries[entry.fd]?.token == entry.token { takeOut(entry.fd, &state) }
                    }
                }
            }
            let closing = state.withLock { state -> [Int32] in
                state.dispatching = false
                return Array(state.closing)
            }
            finishClosing(closing)
            timeout = tick?() ?? -1
        }
    }

    /// Closes descriptors already taken out of the set, then lets ``remove(_:)`` know.
    private func finishClosing(_ descriptors: [Int32]) {
        guard !descriptors.isEmpty else { return }
        for fd in descriptors { close(fd) }
        state.withLock { $0.closing.subtract(descriptors) }
        endRound()
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
