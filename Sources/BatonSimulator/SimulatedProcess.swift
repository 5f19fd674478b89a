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
    private let state = Mutex<State>(State())

    private struct State {
        var exitStatus: Int32?
        var stopped = false
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
        // Above 3, so that dup2 onto 3 always makes a new descriptor without FD_CLOEXEC.
        let childEnd = fcntl(pair[1], F_DUPFD_CLOEXEC, 10)
        close(pair[1])
        guard childEnd >= 0 else {
            close(pair[0])
            throw SimulatorError.system("fcntl F_DUPFD_CLOEXEC", errno)
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, 2, 1)
        posix_spawn_file_actions_adddup2(&actions, childEnd, Self.lifecycleDescriptor)
        // Descriptors created without O_CLOEXEC by other threads (server sockets, pipes of
        // other children) must not leak into the child, or a dead core's socket stays open.
        Self.closeFrom(&actions, Self.lifecycleDescriptor + 1)
        var environment: [String: String] = [:]
        var pointer = environ
        while let entry = pointer.pointee {
            let text = String(cString: entry)
            if let equals = text.firstIndex(of: "=") {
                environment[String(text[..<equals])] = String(text[text.index(after: equals)...])
            }
            pointer += 1
        }
        environment["BATON_DIE_WITH_PARENT"] = "1"
        environment[Self.lifecycleVariable] = String(Self.lifecycleDescriptor)
        for (key, value) in extra { environment[key] = value }
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // A program run under the simulator starts with default signal dispositions (ours ignores SIGPIPE).
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGPIPE)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF))
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        // posix_spawnp: a program named without a path (`python3`) is looked up in PATH.
        let result = posix_spawnp(&pid, executable, &actions, &attributes, argv, envp)
        close(childEnd)
        guard result == 0 else {
            close(pair[0])
            throw SimulatorError.system("posix_spawn \(executable)", result)
        }
        self.label = label
        self.pid = pid
        self.input = pair[0]
        let output = pair[0]
        LineReader.start(fd: output, name: "sim-out-\(pid)", onLine: { [self] line in
            guard line.hasPrefix("{"), var event = try? JSONDecoder().decode(SimulatorEvent.self, from: Data(line.utf8)) else { return }
            event.process = self.label
            event.pid = self.pid
            onEvent(self, event)
        }, onEnd: { [self] in
            var status: Int32 = 0
            while waitpid(self.pid, &status, 0) < 0 && errno == EINTR {}
            let low = status & 0x7f
            let exit = low == 0 ? (status >> 8) & 0xff : 128 + low
            let input = self.state.withLock { state -> Int32? in
                state.exitStatus = exit
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

    private typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    /// `posix_spawn_file_actions_addclosefrom_np` (glibc 2.34+), looked up at run time because
    /// the Glibc module does not export GNU extensions.
    private static let closeFromFunction: CloseFrom? = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: CloseFrom.self)
    }()

    private static func closeFrom(_ actions: inout posix_spawn_file_actions_t, _ fd: Int32) {
        _ = closeFromFunction?(&actions, fd)
    }

    /// Sends one command line to the child; false when it is gone.
    @discardableResult
    public func send(_ command: ChildCommand) -> Bool {
        guard let data = try? JSONEncoder().encode(command) else { return false }
        return state.withLock { state -> Bool in
            guard !state.inputClosed, state.exitStatus == nil else { return false }
            return LineReader.writeAll(input, String(decoding: data, as: UTF8.self) + "\n")
        }
    }

    /// Sends a signal (SIGKILL, SIGSTOP, SIGCONT...) unless the child is already reaped.
    public func signal(_ number: Int32) {
        state.withLock { state in
            guard state.exitStatus == nil else { return }
            if number == SIGSTOP { state.stopped = true }
            if number == SIGCONT || number == SIGKILL { state.stopped = false }
            kill(pid, number)
        }
    }

    /// True until the child has exited and was reaped.
    public var isRunning: Bool { state.withLock { $0.exitStatus == nil } }
    /// True while stopped by ``signal(_:)`` with SIGSTOP.
    public var isStopped: Bool { state.withLock { $0.stopped && $0.exitStatus == nil } }
    /// The exit status once reaped (128+N when killed by signal N).
    public var exitStatus: Int32? { state.withLock { $0.exitStatus } }

    deinit {
        if isRunning { kill(pid, SIGKILL) }
        state.withLock { state in
            if !state.inputClosed { close(input) }
            state.inputClosed = true
        }
    }
}
