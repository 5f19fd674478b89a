import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// A child started by ``ChildSpawn``: its pid, the parent's ends of its pipes, signals and
/// exit status. A signal is never sent after the child was reaped (its pid may be reused);
/// the child is killed with SIGKILL and reaped when this object goes away.
package final class SpawnedProcess: Sendable {
    package let pid: pid_t
    /// The write end of the child's standard input, when it is a pipe.
    package let input: Int32?
    /// The read ends of its standard output and error, when they are pipes.
    package let output: Int32?
    package let errors: Int32?
    private let state = Mutex<(status: Int32?, stopped: Bool, inputClosed: Bool)>((nil, false, false))

    init(pid: pid_t, input: Int32?, output: Int32?, errors: Int32?) {
        self.pid = pid
        self.input = input
        self.output = output
        self.errors = errors
    }

    /// Sends `number` (SIGKILL, SIGSTOP, SIGCONT, SIGTERM...) unless the child was reaped.
    package func signal(_ number: Int32) {
        state.withLock { state in
            guard state.status == nil else { return }
            if number == SIGSTOP { state.stopped = true }
            if number == SIGCONT || number == SIGKILL { state.stopped = false }
            kill(pid, number)
        }
    }

    /// True while stopped by ``signal(_:)`` with SIGSTOP and not reaped.
    package var isStopped: Bool { state.withLock { $0.stopped && $0.status == nil } }

    /// The exit status once reaped: the exit code, or 128+N when killed by signal N.
    package var exitStatus: Int32? { state.withLock { $0.status } }

    /// Reaps the child if it has exited (or waits for it when `blocking`); its exit status.
    @discardableResult
    package func reap(blocking: Bool) -> Int32? {
        if let status = exitStatus { return status }
        var raw: Int32 = 0
        var result: pid_t
        repeat { result = waitpid(pid, &raw, blocking ? 0 : WNOHANG) } while result < 0 && errno == EINTR
        return state.withLock { state in
            if let status = state.status { return status }
            guard result == pid else { return nil }
            let low = raw & 0x7f
            state.status = low == 0 ? (raw >> 8) & 0xff : 128 + low
            return state.status
        }
    }

    /// Waits for the child to exit (blocking this thread); its exit status.
    @discardableResult
    package func wait() -> Int32 { reap(blocking: true) ?? -1 }

    /// Waits for the child to exit, checking every 5 ms; nil after `timeout`.
    package func wait(timeout: Duration) async throws -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let status = reap(blocking: false) { return status }
            try await Task.sleep(for: .milliseconds(5))
        }
        return reap(blocking: false)
    }

    /// Writes `text` to the child's standard input; false when it is gone or not a pipe.
    @discardableResult
    package func write(_ text: String) -> Bool {
        state.withLock { state in
            guard let input, !state.inputClosed else { return false }
            return LineReader.writeAll(input, text)
        }
    }

    /// Closes the child's standard input (it reads the end of file).
    package func closeInput() {
        state.withLock { state in
            if let input, !state.inputClosed { close(input) }
            state.inputClosed = true
        }
    }

    /// Reads the child's standard output to its end (blocking); its bytes.
    package func readOutputToEnd() -> [UInt8] {
        guard let output else { return [] }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(output, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { return bytes }
            bytes += buffer[0..<count]
        }
    }

    deinit {
        if reap(blocking: false) == nil {
            signal(SIGKILL)
            reap(blocking: true)
        }
        closeInput()
        // The read ends are closed by their readers (``LineReader``) or here.
        if let output { close(output) }
        if let errors { close(errors) }
    }
}
