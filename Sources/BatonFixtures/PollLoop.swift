import CBatonShims
import Foundation
import Synchronization

/// One thread blocked in `poll(2)` over a changing set of descriptors, for the loopback test
/// server and its clients. Handlers run on that thread; a handler that returns `false` has its
/// descriptor removed and closed by the loop (only the loop closes registered descriptors, so a
/// descriptor number is never reused while another thread may still act on it).
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

    /// Starts the thread.
    package init(name: String) throws {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { throw POSIXError(.EMFILE) }
        for end in ends {
            _ = baton_fcntl_int(end, F_SETFD, FD_CLOEXEC)
            _ = baton_fcntl_int(end, F_SETFL, O_NONBLOCK)
        }
        wakeRead = ends[0]
        wakeWrite = ends[1]
        let thread = Thread { [self] in self.run() }
        thread.name = name
        thread.start()
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

    package func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    private func run() {
        var drain = [UInt8](repeating: 0, count: 256)
        while true {
            let (entries, removed, stopped) = state.withLock { state in
                let removed = state.handlers.filter { state.stopped || state.removals.contains($0.fd) }.map(\.fd)
                state.handlers.removeAll { removed.contains($0.fd) }
                state.removals.removeAll()
                return (state.handlers, removed, state.stopped)
            }
            for fd in removed { close(fd) }
            if stopped { return }
            var descriptors = entries.map { pollfd(fd: $0.fd, events: $0.events, revents: 0) }
            descriptors.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
            let ready = poll(&descriptors, nfds_t(descriptors.count), -1)
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
        }
    }

    deinit {
        close(wakeRead)
        close(wakeWrite)
    }
}
