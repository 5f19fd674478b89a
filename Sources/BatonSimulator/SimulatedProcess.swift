import Baton
import BatonSpawn
import CBatonShims
import Synchronization
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// A child process the simulator controls: the package's own `baton` executable in one of its
/// simulator modes. Commands go to its standard input and events come back from its standard
/// output, one JSON object a line. It dies with the simulator (`PR_SET_PDEATHSIG`).
public final class SimulatedProcess: Sendable {
    /// Its lane in the timeline (`app#1`, `extension#3`).
    public let label: String
    /// Its process id.
    public let pid: Int32
    private let input: Int32
    private let process: SpawnedProcess
    private let state = Mutex<State>(State())

    private struct State {
        var inputClosed = false
    }

    /// Spawns `executable arguments`.
    /// - Parameters:
    ///   - onEvent: Called on a reader thread for each event line the child prints.
    ///   - onExit: Called once with the exit status (128+N for signal N) after the child is reaped.
    /// - Throws: `systemCallFailed` when the process cannot be started.
    init(
        label: String,
        executable: String,
        arguments: [String],
        environment extra: [String: String],
        onEvent: @escaping @Sendable (SimulatedProcess, SimulatorEvent) -> Void,
        onExit: @escaping @Sendable (SimulatedProcess, Int32) -> Void
    ) throws {
        // One socket pair carries the lifecycle protocol both ways; the child's end becomes its
        // descriptor 3, named by BATON_LIFECYCLE_FD. Its standard output goes to our standard
        // error (a program's prints never mix with a JSON report), its standard input is empty.
        var pair: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            throw SimulatorError.system("socketpair", errno)
        }
        defer { close(pair[1]) }
        var spawn = ChildSpawn(executable, arguments)
        spawn.searchPath = true // a program named without a path (`python3`) is looked up in PATH
        spawn.standardInput = .null
        spawn.standardOutput = .standardError
        spawn.descriptors = [Self.lifecycleDescriptor: pair[1]]
        spawn.dieWithParent()
        spawn.environment[Self.lifecycleVariable] = String(Self.lifecycleDescriptor)
        for (key, value) in extra { spawn.environment[key] = value }
        let process: SpawnedProcess
        do {
            process = try spawn.spawn()
        } catch {
            close(pair[0])
            throw BatonError(.simulationFailed, "cannot start \(executable): \(error.message)", cause: error)
        }
        self.label = label
        self.pid = process.pid
        self.process = process
        self.input = pair[0]
        let output = pair[0]
        LineReader.start(fd: output, name: "sim-out-\(pid)", onLine: { [self] line in
            guard line.hasPrefix("{"), var event = try? JSONDecoder().decode(SimulatorEvent.self, from: Data(line.utf8)) else { return }
            event.process = self.label
            event.pid = self.pid
            onEvent(self, event)
        }, onEnd: { [self] in
            let exit = self.process.wait()
            let input = self.state.withLock { state -> Int32? in
                defer { state.inputClosed = true }
                return state.inputClosed ? nil : self.input
            }
            if let input { close(input) }
            onExit(self, exit)
        })
    }

    /// The child's descriptor for the lifecycle protocol.
    public static let lifecycleDescriptor: Int32 = 3
    /// The environment variable that names it.
    public static let lifecycleVariable = "BATON_LIFECYCLE_FD"

    /// Sends one command line to the child; false when it is gone.
    @discardableResult
    public func send(_ command: ChildCommand) -> Bool {
        guard let data = try? JSONEncoder().encode(command) else { return false }
        return state.withLock { state -> Bool in
            guard !state.inputClosed, process.exitStatus == nil else { return false }
            return LineReader.writeAll(input, String(decoding: data, as: UTF8.self) + "\n")
        }
    }

    /// Sends a signal (SIGKILL, SIGSTOP, SIGCONT...) unless the child is already reaped.
    public func signal(_ number: Int32) { process.signal(number) }

    /// True until the child has exited and was reaped.
    public var isRunning: Bool { process.exitStatus == nil }
    /// True while stopped by ``signal(_:)`` with SIGSTOP.
    public var isStopped: Bool { process.isStopped }
    /// The exit status once reaped (128+N when killed by signal N).
    public var exitStatus: Int32? { process.exitStatus }

    deinit {
        state.withLock { state in
            if !state.inputClosed { close(input) }
            state.inputClosed = true
        }
    }
}
