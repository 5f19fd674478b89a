import Baton
import BatonSimulator
import Foundation
import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// A real child process of the package's own `baton` executable, for tests.
///
/// Standard output is read line by line on a thread; ``line(matching:timeout:)`` waits for a
/// line. The child is killed with SIGKILL and reaped when this object goes away, and it dies
/// with the test runner (`BATON_DIE_WITH_PARENT`).
package final class ChildProcess: Sendable {
    package let pid: pid_t
    package let arguments: [String]
    private let output = Mutex<(lines: [String], closed: Bool, consumed: Int)>(([], false, 0))
    private let exitStatus = Mutex<Int32?>(nil)
    private let errorOutput = Mutex<[String]>([])
    /// Set when the child's standard error reaches its end.
    private let errorsClosed = Mutex(false)

    /// The `baton` executable next to the test bundle (override with `BATON_EXECUTABLE`).
    package static var executable: String {
        if let path = ProcessInfo.processInfo.environment["BATON_EXECUTABLE"] { return path }
        return besideTestBundle("baton")
    }

    /// The `baton-harness` executable (the test and benchmark workers) next to the test bundle
    /// (override with `BATON_HARNESS_EXECUTABLE`).
    package static var harnessExecutable: String {
        if let path = ProcessInfo.processInfo.environment["BATON_HARNESS_EXECUTABLE"] { return path }
        return besideTestBundle("baton-harness")
    }

    /// `name` in the build directory that holds the test bundle.
    private static func besideTestBundle(_ name: String) -> String {
        let me = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        var directory = me.deletingLastPathComponent()
        // The test bundle may sit in a `.xctest` directory on some toolchains.
        if directory.lastPathComponent.hasSuffix(".xctest") { directory = directory.deletingLastPathComponent() }
        return directory.appendingPathComponent(name).path
    }

    /// Starts `baton <arguments>` with `BATON_CONTAINER` set to `container`.
    package convenience init(_ arguments: [String], container: String?, environment extra: [String: String] = [:]) throws {
        try self.init(rawArguments: arguments.map { Array($0.utf8) }, container: container, environment: extra)
    }

    /// Starts `baton-harness <arguments>` (a test worker) with `BATON_CONTAINER` set to `container`.
    package convenience init(harness arguments: [String], container: String?, environment extra: [String: String] = [:]) throws {
        try self.init(
            rawArguments: arguments.map { Array($0.utf8) }, container: container, environment: extra,
            executable: ChildProcess.harnessExecutable)
    }

    /// Starts `baton` with arguments given as raw bytes (which need not be valid UTF-8), or
    /// `program <baton> <arguments>` when `program` is given (such as `/usr/bin/setpriv` with
    /// its own options first in `programArguments`). `executable` is `baton` unless given (``harnessExecutable``).
    package init(
        rawArguments: [[UInt8]],
        container: String?,
        environment extra: [String: String] = [:],
        program: String? = nil,
        programArguments: [String] = [],
        executable: String = ChildProcess.executable
    ) throws {
        let arguments = rawArguments.map { String(decoding: $0, as: UTF8.self) }
        self.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        if let container { environment["BATON_CONTAINER"] = container }
        environment["BATON_DIE_WITH_PARENT"] = "1"
        for (key, value) in extra { environment[key] = value }

        var errorPipe: [Int32] = [0, 0]
        guard POSIX.pipe(&errorPipe) == 0 else { throw POSIXError(.EIO) }
        _ = fcntl(errorPipe[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(errorPipe[1], F_SETFD, FD_CLOEXEC)
        var pipe: [Int32] = [0, 0]
        guard POSIX.pipe(&pipe) == 0 else { throw POSIXError(.EIO) }
        _ = fcntl(pipe[0], F_SETFD, FD_CLOEXEC)
        _ = fcntl(pipe[1], F_SETFD, FD_CLOEXEC)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, pipe[1], 1)
        posix_spawn_file_actions_adddup2(&actions, errorPipe[1], 2)
        let prefix = program.map { [Array($0.utf8)] + programArguments.map { Array($0.utf8) } } ?? []
        let argv = (prefix + [Array(executable.utf8)] + rawArguments).map { bytes -> UnsafeMutablePointer<CChar>? in
            let copy = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count + 1)
            for (index, byte) in bytes.enumerated() { copy[index] = CChar(bitPattern: byte) }
            copy[bytes.count] = 0
            return copy
        } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { $0?.deallocate() }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, program ?? executable, &actions, nil, argv, envp)
        POSIX.close(pipe[1])
        POSIX.close(errorPipe[1])
        guard result == 0 else {
            POSIX.close(errorPipe[0])
            POSIX.close(pipe[0])
            throw POSIXError(POSIXErrorCode(rawValue: result) ?? .EIO)
        }
        self.pid = pid
        let readFD = pipe[0]
        let thread = Thread { [self] in self.readLines(readFD, errors: false) }
        thread.start()
        let errorFD = errorPipe[0]
        let errorThread = Thread { [self] in self.readLines(errorFD, errors: true) }
        errorThread.start()
    }

    private func readLines(_ fd: Int32, errors: Bool) {
        var pending = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { POSIX.read(fd, $0.baseAddress!, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { break }
            pending.append(contentsOf: buffer[0..<count])
            while let newline = pending.firstIndex(of: 10) {
                let line = String(decoding: pending[..<newline], as: UTF8.self)
                pending.removeSubrange(...newline)
                append(line, errors: errors)
            }
        }
        if !pending.isEmpty {
            append(String(decoding: pending, as: UTF8.self), errors: errors)
        }
        POSIX.close(fd)
        if errors {
            errorsClosed.withLock { $0 = true }
        } else {
            output.withLock { $0.closed = true }
        }
    }

    private func append(_ line: String, errors: Bool) {
        if errors {
            errorOutput.withLock { $0.append(line) }
        } else {
            output.withLock { $0.lines.append(line) }
        }
    }

    /// Every line the child wrote to standard error so far.
    package var errorLines: [String] { errorOutput.withLock { $0 } }

    /// Every line printed so far.
    package var lines: [String] { output.withLock { $0.lines } }

    /// Waits for the next line (after the ones already returned by this method) that satisfies
    /// `predicate`; throws after `timeout` seconds or if the output closes first.
    @discardableResult
    package func line(timeout: Double = 10, matching predicate: @Sendable (String) -> Bool = { _ in true }) async throws -> String {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            let (found, closed) = output.withLock { state -> (String?, Bool) in
                while state.consumed < state.lines.count {
                    let line = state.lines[state.consumed]
                    state.consumed += 1
                    if predicate(line) { return (line, false) }
                }
                return (nil, state.closed)
            }
            if let found { return found }
            if closed { throw TestFailure("output of baton \(arguments.joined(separator: " ")) closed before the expected line; got: \(lines)") }
            try await Task.sleep(for: .milliseconds(2))
        }
        throw TestFailure("timed out after \(timeout)s waiting for a line from baton \(arguments.joined(separator: " ")); got: \(lines), stderr: \(errorLines)")
    }

    package func signal(_ number: Int32) { POSIX.kill(pid, number) }

    /// Waits for the child to exit; returns its exit status (128+N when killed by signal N).
    /// Then waits (a second at most) for the reader threads to reach the end of the child's
    /// output and standard error, so that ``lines`` and ``errorLines`` hold everything the child
    /// printed.
    @discardableResult
    package func wait(timeout: Double = 20) async throws -> Int32 {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if let status = reap(blocking: false) {
                for _ in 0..<200 where !outputClosed || !errorsClosed.withLock({ $0 }) {
                    try await Task.sleep(for: .milliseconds(5))
                }
                return status
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        throw TestFailure("baton \(arguments.joined(separator: " ")) did not exit within \(timeout)s")
    }

    private func reap(blocking: Bool) -> Int32? {
        exitStatus.withLock { cached in
            if let cached { return cached }
            var status: Int32 = 0
            let result = waitpid(pid, &status, blocking ? 0 : WNOHANG)
            guard result == pid else { return nil }
            let low = status & 0x7f
            cached = low == 0 ? (status >> 8) & 0xff : 128 + low
            return cached
        }
    }

    deinit {
        if reap(blocking: false) == nil {
            POSIX.kill(pid, SIGKILL)
            _ = reap(blocking: true)
        }
    }
}

/// Runs `baton <arguments>` to completion and returns its status and output lines.
package func runBaton(_ arguments: [String], container: String?, timeout: Double = 30) async throws -> (status: Int32, lines: [String], errors: [String]) {
    let child = try ChildProcess(arguments, container: container)
    let status = try await child.wait(timeout: timeout)
    return (status, child.lines, child.errorLines)
}

/// Runs `baton-harness <arguments>` (a test worker) to its end.
package func runHarness(_ arguments: [String], container: String?, timeout: Double = 30) async throws -> (status: Int32, lines: [String], errors: [String]) {
    let child = try ChildProcess(harness: arguments, container: container)
    let status = try await child.wait(timeout: timeout)
    return (status, child.lines, child.errorLines)
}

extension ChildProcess {
    package var outputClosed: Bool { output.withLock { $0.closed } }
}

package struct TestFailure: Error, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}

/// A fresh temporary container directory, removed when the value is released.
package final class TemporaryContainer: Sendable {
    package let path: String
    package init() throws {
        var template = Array((NSTemporaryDirectory() + "baton-test-XXXXXX").utf8CString)
        guard let result = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw POSIXError(.EIO)
        }
        path = String(cString: result)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// Kernel file locks, read by the simulator's `/proc` reader (to the end of `/proc/locks`).
package enum ProcLocks {
    package struct Entry: Hashable {
        package var kind: String   // FLOCK, POSIX, OFDLCK
        package var pid: pid_t
        package var inode: UInt64
        package var waiting: Bool

        init(_ lock: ProcFS.Lock) {
            (kind, pid, inode, waiting) = (lock.kind, lock.pid, lock.inode, lock.waiting)
        }
    }

    package static func all() -> [Entry] { ProcFS.locks().map(Entry.init) }

    /// Locks held (not merely awaited) by `pid` on files under `directory`.
    package static func held(by pid: pid_t, under directory: String) -> [Entry] {
        ProcFS.locksHeld(by: pid, under: directory).map(Entry.init)
    }

    /// Locks held by `pid` under the container `directory` on anything but the owner tokens
    /// (`.baton/owners/*`, which the container's suspension releases, not a database's).
    package static func held(by pid: pid_t, under directory: String, exceptOwnerTokens: Bool) -> [Entry] {
        let owners = directory + "/.baton/owners"
        let tokens = Set(((try? FileManager.default.contentsOfDirectory(atPath: owners)) ?? []).compactMap { name -> UInt64? in
            var info = stat()
            return stat(owners + "/" + name, &info) == 0 ? UInt64(info.st_ino) : nil
        })
        return held(by: pid, under: directory).filter { !exceptOwnerTokens || !tokens.contains($0.inode) }
    }
}

/// Runs `body`, failing with ``TestFailure`` if it has not finished within `seconds` (the body
/// is cancelled then): a test that waits for an event that never comes fails instead of hanging.
package func within<T: Sendable>(_ seconds: Double, _ what: String, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else {
            throw TestFailure("\(what) did not happen within \(seconds) s")
        }
        return value
    }
}
