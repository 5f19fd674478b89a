import Baton
import BatonCommandSupport
import BatonSimulator
import BatonSpawn
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
/// line. It is started by the package's one spawner (``ChildSpawn``: close-on-exec pipes, an
/// explicit environment); it is killed with SIGKILL and reaped when this object goes away, and
/// it dies with the test runner (`BATON_DIE_WITH_PARENT`).
package final class ChildProcess: Sendable {
    package let pid: pid_t
    package let arguments: [String]
    private let process: SpawnedProcess
    private let output = Mutex<(lines: [String], closed: Bool, consumed: Int)>(([], false, 0))
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
        var spawn = ChildSpawn(program ?? executable)
        spawn.arguments = (program == nil ? [] : programArguments.map { Array($0.utf8) } + [Array(executable.utf8)]) + rawArguments
        if let container { spawn.environment["BATON_CONTAINER"] = container }
        spawn.dieWithParent()
        for (key, value) in extra { spawn.environment[key] = value }
        spawn.standardOutput = .pipe
        spawn.standardError = .pipe
        let process = try spawn.spawn()
        self.process = process
        self.pid = process.pid
        LineReader.start(fd: process.output!, name: "child-out-\(pid)", onLine: { [self] line in
            output.withLock { $0.lines.append(line) }
        }, onEnd: { [self] in
            output.withLock { $0.closed = true }
        })
        LineReader.start(fd: process.errors!, name: "child-err-\(pid)", onLine: { [self] line in
            errorOutput.withLock { $0.append(line) }
        }, onEnd: { [self] in
            errorsClosed.withLock { $0 = true }
        })
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
        var lastLook = false
        while !lastLook {
            // One more look once the deadline passed, as in ``wait(timeout:)``: a task resumed
            // late (the cooperative pool busy with other tests) must not miss a line printed in
            // time (seen under load: "timed out after 30.0s waiting for a line…; got: [ready]").
            lastLook = Date() >= deadline
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
            if !lastLook { try await Task.sleep(for: .milliseconds(2)) }
        }
        throw TestFailure("timed out after \(timeout)s waiting for a line from baton \(arguments.joined(separator: " ")); got: \(lines), stderr: \(errorLines)")
    }

    package func signal(_ number: Int32) { process.signal(number) }

    /// Waits for the child to exit; returns its exit status (128+N when killed by signal N).
    /// Then waits (a second at most) for the reader threads to reach the end of the child's
    /// output and standard error, so that ``lines`` and ``errorLines`` hold everything the child
    /// printed.
    @discardableResult
    package func wait(timeout: Double = 20) async throws -> Int32 {
        let deadline = Date().addingTimeInterval(timeout)
        var lastLook = false
        while !lastLook {
            // One more look once the deadline passed: a task resumed late (the test runner's
            // cooperative pool is busy with other tests) must not call an exited child hung.
            lastLook = Date() >= deadline
            if let status = process.reap(blocking: false) {
                for _ in 0..<200 where !outputClosed || !errorsClosed.withLock({ $0 }) {
                    try await Task.sleep(for: .milliseconds(5))
                }
                return status
            }
            if !lastLook { try await Task.sleep(for: .milliseconds(5)) }
        }
        throw TestFailure("baton \(arguments.joined(separator: " ")) did not exit within \(timeout)s")
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

/// ``runProgram(_:_:)`` from a task: the spawn and the reads to the end of the program's output
/// run on a thread of their own (``onOwnThread(_:)``), not on a thread of Swift's cooperative
/// pool. (In an async context Swift picks this overload.) Parked on the pool, a read of a
/// program that is slow to start (`baton` itself, under load) left the other suites of a
/// 2-core run one pool thread: seen as a loopback source that got no line in 10 s while
/// another test read `baton --experimental-dump-help` to its end.
package func runProgram(_ path: String, _ arguments: [String]) async throws -> (status: Int32, output: [UInt8], errors: String) {
    try await onOwnThread { try runProgram(path, arguments) }
}

/// Runs a program other than `baton` (`sqlite3`, `ip`, `setpriv`, `mount`) to completion with
/// the package's one spawner: its exit status, standard output and standard error. It blocks
/// the calling thread; from a task, use the async overload.
package func runProgram(_ path: String, _ arguments: [String]) throws -> (status: Int32, output: [UInt8], errors: String) {
    var spawn = ChildSpawn(path, arguments)
    spawn.standardInput = .null
    spawn.standardOutput = .pipe
    spawn.standardError = .pipe
    let process = try spawn.spawn()
    let errors = Mutex<(lines: [String], done: Bool)>(([], false))
    LineReader.start(fd: process.errors!, name: "program-err-\(process.pid)", onLine: { line in
        errors.withLock { $0.lines.append(line) }
    }, onEnd: { [process] in
        // Holds the process (and so the descriptor the reader reads) until the end.
        _ = process
        errors.withLock { $0.done = true }
    })
    let output = process.readOutputToEnd()
    let status = process.wait()
    for _ in 0..<1000 where !errors.withLock({ $0.done }) { usleep(1000) }
    return (status, output, errors.withLock { $0.lines.joined(separator: "\n") })
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
    /// Removes the directory (``removeTree(_:)``, which tries again when a file went away).
    deinit { removeTree(path) }
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

    /// The files under `directory` (relative paths) that `pid` holds a lock on through one of
    /// its descriptors: what a failed expectation on ``held(by:under:)`` should say.
    package static func files(lockedBy pid: pid_t, under directory: String) -> [String] {
        ProcFS.lockedFiles(of: pid, under: directory)
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

/// Waits until `condition` holds, looking every 5 ms, `seconds` at most: for a state of another
/// thread or process that gives no event to wait for (a word in a mapped table, a count).
/// - Throws: ``TestFailure`` naming `what` when it did not happen in time.
package func eventually(_ what: String, within seconds: Double = 10, _ condition: () throws -> Bool) async throws {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while try !condition() {
        guard ContinuousClock.now < deadline else { throw TestFailure("\(what) did not happen within \(seconds) s") }
        try await Task.sleep(for: .milliseconds(5))
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
