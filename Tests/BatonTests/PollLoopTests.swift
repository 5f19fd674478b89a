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

/// The loopback fixtures' poll thread and the descriptors it owns. Found in full test runs (1 in
/// 3 on this machine): a child's first output line began with a stray `0x01`. A server stopped
/// twice (its task cancelled, then its last reference dropped) woke its loop again after the
/// loop's thread had closed its wake-up pipe, and the byte went to whatever descriptor had
/// reused the number: the pipe of a child's standard output spawned in between, or a file.
@Suite("Poll loop")
struct PollLoopTests {
    /// `count` connected socket pairs: a byte written to either end of one is readable at the
    /// other, so a stray write to any of these numbers is seen, whichever end reused it.
    private static func socketPairs(_ count: Int) -> [(Int32, Int32)] {
        (0..<count).compactMap { _ in
            var ends: [Int32] = [-1, -1]
            // Close-on-exec: a child spawned by a test running beside this one must not keep a
            // copy (the peer would not see the end of file while the child lives).
            guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0 else { return nil }
            return (ends[0], ends[1])
        }
    }

    /// The ends of `pairs` that have something to read (0 ms poll).
    private static func readable(_ pairs: [(Int32, Int32)]) -> [Int32] {
        var entries = pairs.flatMap { [pollfd(fd: $0.0, events: Int16(POLLIN), revents: 0), pollfd(fd: $0.1, events: Int16(POLLIN), revents: 0)] }
        _ = poll(&entries, nfds_t(entries.count), 0)
        return entries.filter { $0.revents != 0 }.map(\.fd)
    }

    /// Both ways of waiting: epoll (Linux's default) and `poll(2)` (the other platforms').
    static let backends: [PollLoop.Backend] = [.epoll, .poll]

    @Test("a loop woken or stopped again after its thread ended writes into no other descriptor", arguments: backends)
    func wakesAfterTheThreadEndedStayInTheLoop(backend: PollLoop.Backend) throws {
        let loop = try PollLoop(name: "test-poll", backend: backend)
        loop.stop()
        loop.waitUntilExited()
        // Every low number the loop's thread could have closed is now taken by these.
        let pairs = Self.socketPairs(64)
        defer { for (a, b) in pairs { close(a); close(b) } }
        try #require(pairs.count == 64)
        loop.wake()
        loop.stop()
        loop.remove(pairs[0].0) // never registered: returns at once, closes nothing
        #expect(Self.readable(pairs).isEmpty, "a byte meant for the loop's pipe reached a socket that reused its number")
        #expect(fcntl(pairs[0].0, F_GETFD) >= 0)
    }

    @Test("a descriptor handed to a stopped loop is closed, not leaked", arguments: backends)
    func addAfterStopClosesTheDescriptor(backend: PollLoop.Backend) throws {
        let loop = try PollLoop(name: "test-poll", backend: backend)
        loop.stop()
        loop.waitUntilExited()
        let pair = try #require(Self.socketPairs(1).first)
        defer { close(pair.1) }
        let called = Mutex(false)
        try loop.add(pair.0) { _ in called.withLock { $0 = true }; return true }
        var entry = pollfd(fd: pair.1, events: Int16(POLLIN), revents: 0)
        #expect(poll(&entry, 1, 5_000) == 1)
        var byte: UInt8 = 0
        #expect(recv(pair.1, &byte, 1, Int32(MSG_DONTWAIT)) == 0, "the peer reads the end of file: the loop closed its end")
        #expect(!called.withLock { $0 })
    }

    /// The socket's inode while `fd` names it; `nil` once the number is closed or names
    /// something else (another thread may reuse a closed number at once).
    private static func inode(_ fd: Int32) -> UInt64? {
        var info = stat()
        guard fstat(fd, &info) == 0 else { return nil }
        return UInt64(info.st_ino)
    }

    @Test("remove returns once the loop has closed the descriptor, and a registered one is closed by stop", arguments: backends)
    func removeWaitsForTheClose(backend: PollLoop.Backend) throws {
        let loop = try PollLoop(name: "test-poll", backend: backend)
        defer { loop.stop() }
        for _ in 0..<200 {
            let pair = try #require(Self.socketPairs(1).first)
            defer { close(pair.1) }
            let socket = try #require(Self.inode(pair.0))
            try loop.add(pair.0) { _ in true }
            loop.remove(pair.0)
            // Closed before `remove` returned: the number no longer names that socket. (Its
            // peer's end of file can come later: a child spawned beside this test holds a copy
            // of every descriptor between its fork and its exec.)
            #expect(Self.inode(pair.0) != socket)
        }
        let kept = try #require(Self.socketPairs(1).first)
        defer { close(kept.1) }
        try loop.add(kept.0) { _ in true }
        loop.stop()
        loop.waitUntilExited()
        var entry = pollfd(fd: kept.1, events: Int16(POLLIN), revents: 0)
        #expect(poll(&entry, 1, 5_000) == 1, "stop closed the registered descriptor")
    }

    @Test("with epoll, descriptors come and go without waking the loop's thread; with poll(2), each change wakes it")
    func changesWakeTheThreadOnlyWithPoll() throws {
        for backend in Self.backends {
            let loop = try PollLoop(name: "test-poll", backend: backend)
            defer { loop.stop() }
            // Let the thread reach its first wait.
            let warm = try #require(Self.socketPairs(1).first)
            try loop.add(warm.0) { _ in true }
            loop.remove(warm.0)
            close(warm.1)
            let before = loop.waits
            for _ in 0..<50 {
                let pair = try #require(Self.socketPairs(1).first)
                defer { close(pair.1) }
                try loop.add(pair.0) { _ in true }
                #expect(loop.remove(pair.0))
            }
            let woken = loop.waits - before
            switch backend {
            case .epoll: #expect(woken == 0, "epoll: 50 adds and removes woke the thread \(woken) times")
            case .poll: #expect(woken >= 50, "poll: a removal is made by the thread, which must wake")
            }
        }
    }

    @Test("a descriptor removed while its handler runs is closed after the handler returns, and events still arrive", arguments: backends)
    func removeDuringTheHandlerWaitsForIt(backend: PollLoop.Backend) async throws {
        let loop = try PollLoop(name: "test-poll", backend: backend)
        defer { loop.stop() }
        let pair = try #require(Self.socketPairs(1).first)
        defer { close(pair.1) }
        let socket = try #require(Self.inode(pair.0))
        // The handler reads one byte, says it is in, then waits for the test to let it go.
        let inHandler = Mutex(false), release = Mutex(false), seenInside = Mutex<UInt64?>(nil)
        try loop.add(pair.0) { _ in
            var byte: UInt8 = 0
            _ = recv(pair.0, &byte, 1, Int32(MSG_DONTWAIT))
            inHandler.withLock { $0 = true }
            while !release.withLock({ $0 }) { usleep(1_000) } // test code: the handler is held open
            seenInside.withLock { $0 = Self.inode(pair.0) }
            return true
        }
        var byte: UInt8 = 7
        #expect(send(pair.1, &byte, 1, 0) == 1)
        while !inHandler.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(1)) }
        // `remove` from another thread must wait for the handler, which still uses the number.
        // (A thread of its own: a blocked task would hold one of the few cooperative threads.)
        let removed = Mutex<Bool?>(nil)
        KernelThread.spawn(name: "test-remove") {
            let result = loop.remove(pair.0)
            removed.withLock { $0 = result }
        }
        try await Task.sleep(for: .milliseconds(50))
        #expect(Self.inode(pair.0) == socket, "closed under a running handler")
        #expect(removed.withLock { $0 } == nil, "remove returned while the handler ran")
        release.withLock { $0 = true }
        while removed.withLock({ $0 }) == nil { try await Task.sleep(for: .milliseconds(1)) }
        #expect(removed.withLock { $0 } == true)
        #expect(seenInside.withLock { $0 } == socket)
        #expect(Self.inode(pair.0) != socket, "closed once remove returned")
    }

    #if os(Linux)
    /// `SCHED_OTHER` and `SCHED_BATCH` of <linux/sched.h> (glibc shows the second only to
    /// `_GNU_SOURCE` code, which Swift's Glibc module is not).
    private static let (schedOther, schedBatch): (Int32, Int32) = (0, 3)

    /// The scheduling policy of this process's threads named `name` (sched_getscheduler(2)).
    private static func policies(ofThreadsNamed name: String) -> [Int32] {
        ProcessThreads.all().filter { $0.name == name }.map { sched_getscheduler($0.id) }
    }

    @Test("a loop that must not preempt on waking runs its thread as SCHED_BATCH, a loop by default does not, and the loopback server passes the choice on")
    func loopThatDoesNotPreemptIsBatch() async throws {
        // Names of their own (other tests run loops and servers beside this one).
        let quiet = try PollLoop(name: "test-batch", preemptsOnWake: false)
        let plain = try PollLoop(name: "test-other")
        defer {
            quiet.stop()
            plain.stop()
        }
        // The policy is set by the thread itself, once it starts.
        try await eventually("the thread of the loop made with preemptsOnWake: false running as SCHED_BATCH") {
            Self.policies(ofThreadsNamed: "test-batch") == [Self.schedBatch]
        }
        try await eventually("the other loop's thread running") { Self.policies(ofThreadsNamed: "test-other").count == 1 }
        #expect(Self.policies(ofThreadsNamed: "test-other") == [Self.schedOther])
        // The server passes it on (its thread's name is every server's: at least one is batch).
        let server = try LoopbackServer(messaging: false, preemptsOnWake: false)
        try await eventually("a server's thread as SCHED_BATCH") {
            Self.policies(ofThreadsNamed: "loopback-server").contains(Self.schedBatch)
        }
        withExtendedLifetime(server) {}
    }
    #endif
}
