import Baton
import BatonLoopback
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

    @Test("a loop woken or stopped again after its thread ended writes into no other descriptor")
    func wakesAfterTheThreadEndedStayInTheLoop() throws {
        let loop = try PollLoop(name: "test-poll")
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

    @Test("a descriptor handed to a stopped loop is closed, not leaked")
    func addAfterStopClosesTheDescriptor() throws {
        let loop = try PollLoop(name: "test-poll")
        loop.stop()
        loop.waitUntilExited()
        let pair = try #require(Self.socketPairs(1).first)
        defer { close(pair.1) }
        let called = Mutex(false)
        loop.add(pair.0) { _ in called.withLock { $0 = true }; return true }
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

    @Test("remove returns once the loop has closed the descriptor, and a registered one is closed by stop")
    func removeWaitsForTheClose() throws {
        let loop = try PollLoop(name: "test-poll")
        defer { loop.stop() }
        for _ in 0..<200 {
            let pair = try #require(Self.socketPairs(1).first)
            defer { close(pair.1) }
            let socket = try #require(Self.inode(pair.0))
            loop.add(pair.0) { _ in true }
            loop.remove(pair.0)
            // Closed before `remove` returned: the number no longer names that socket. (Its
            // peer's end of file can come later: a child spawned beside this test holds a copy
            // of every descriptor between its fork and its exec.)
            #expect(Self.inode(pair.0) != socket)
        }
        let kept = try #require(Self.socketPairs(1).first)
        defer { close(kept.1) }
        loop.add(kept.0) { _ in true }
        loop.stop()
        loop.waitUntilExited()
        var entry = pollfd(fd: kept.1, events: Int16(POLLIN), revents: 0)
        #expect(poll(&entry, 1, 5_000) == 1, "stop closed the registered descriptor")
    }
}
