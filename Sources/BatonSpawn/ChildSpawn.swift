import Baton
import CBatonHarness
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#else
#error("BatonSpawn supports Linux and Apple platforms")
#endif

/// How to start a child process: the one spawner of Baton's command line, simulator and tests
/// (`posix_spawn`, never `fork` in a threaded process, never `setenv`).
///
/// Descriptor hygiene: every pipe it makes is close-on-exec from its creation (`pipe2`), the
/// child gets exactly descriptors 0, 1, 2 and the ones in ``descriptors`` (all others are closed
/// in the child), and its environment is the explicit array built here.
package struct ChildSpawn: Sendable {
    /// Where a standard stream of the child goes.
    package enum Stream: Sendable, Equatable {
        /// The parent's own stream.
        case inherit
        /// `/dev/null`.
        case null
        /// A pipe; the parent's end is on the ``SpawnedProcess``.
        case pipe
        /// (standard output only) the child's standard error.
        case standardError
    }

    /// The program: a path, or (with ``searchPath``) a name looked up in `PATH`.
    package var executable: String
    /// Arguments after `argv[0]` (the executable), as bytes: they need not be valid UTF-8.
    package var arguments: [[UInt8]]
    /// The whole environment of the child.
    package var environment: [String: String]
    package var standardInput: Stream = .inherit
    package var standardOutput: Stream = .inherit
    package var standardError: Stream = .inherit
    /// Extra descriptors of the child: child descriptor number -> parent descriptor (which may
    /// be close-on-exec; the child's copy is not).
    package var descriptors: [Int32: Int32] = [:]
    /// Look `executable` up in `PATH` (`posix_spawnp`).
    package var searchPath = false

    /// A child running `executable arguments` with this process's environment.
    package init(_ executable: String, _ arguments: [String] = [], environment: [String: String] = ChildSpawn.inheritedEnvironment()) {
        self.executable = executable
        self.arguments = arguments.map { Array($0.utf8) }
        self.environment = environment
    }

    /// The child exits when this process exits (`BATON_DIE_WITH_PARENT`, honoured by Baton's own
    /// executables through `baton_exit_with_parent`).
    package mutating func dieWithParent() {
        environment["BATON_DIE_WITH_PARENT"] = "1"
    }

    /// This process's environment (read, never written: nothing in Baton calls `setenv`).
    package static func inheritedEnvironment() -> [String: String] {
        var environment: [String: String] = [:]
        var pointer = environ
        while let entry = pointer.pointee {
            let text = String(cString: entry)
            if let equals = text.firstIndex(of: "=") {
                environment[String(text[..<equals])] = String(text[text.index(after: equals)...])
            }
            pointer += 1
        }
        return environment
    }

    /// Starts the child.
    /// - Throws: `systemCallFailed`, with the failing call and errno as its cause.
    package func spawn() throws(BatonError) -> SpawnedProcess {
        var opened: [Int32] = []          // descriptors to close in the parent after the spawn
        var parentEnds: [Int32?] = [nil, nil, nil]
        func closeAll() { for fd in opened + parentEnds.compactMap({ $0 }) { close(fd) } }

        var actions = Self.emptyFileActions()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }

        // Every source descriptor is first copied above the targets (close-on-exec), so that a
        // dup2 onto a target never meets a source of the same number (which would keep its
        // close-on-exec flag) and never overwrites a source still to be copied.
        func lifted(_ fd: Int32) throws(BatonError) -> Int32 {
            let copy = fcntl(fd, F_DUPFD_CLOEXEC, 10)
            guard copy >= 0 else { closeAll(); throw Self.failure("fcntl(F_DUPFD_CLOEXEC)", errno) }
            opened.append(copy)
            return copy
        }

        for (target, stream) in [(Int32(0), standardInput), (1, standardOutput), (2, standardError)] {
            switch stream {
            case .inherit:
                break
            case .null:
                posix_spawn_file_actions_addopen(&actions, target, "/dev/null", target == 0 ? O_RDONLY : O_WRONLY, 0)
            case .standardError:
                posix_spawn_file_actions_adddup2(&actions, 2, target)
            case .pipe:
                var ends: [Int32] = [-1, -1]
                guard baton_pipe_cloexec(&ends, 0) == 0 else { closeAll(); throw Self.failure("pipe2", errno) }
                let (child, parent) = target == 0 ? (ends[0], ends[1]) : (ends[1], ends[0])
                parentEnds[Int(target)] = parent
                opened.append(child)
                posix_spawn_file_actions_adddup2(&actions, try lifted(child), target)
            }
        }
        for (target, source) in descriptors.sorted(by: { $0.key < $1.key }) {
            posix_spawn_file_actions_adddup2(&actions, try lifted(source), target)
        }
        Self.closeFrom(&actions, (descriptors.keys.max() ?? 2) + 1)

        var attributes = Self.emptyAttributes()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // The child starts with no blocked signal and default dispositions (this process
        // ignores SIGPIPE; a shell must see SIGCHLD to reap its own children).
        var none = sigset_t()
        sigemptyset(&none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF) | Self.platformFlags)

        let argv = ([Array(executable.utf8)] + arguments).map { bytes -> UnsafeMutablePointer<CChar>? in
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
        let result = searchPath
            ? posix_spawnp(&pid, executable, &actions, &attributes, argv, envp)
            : posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        for fd in opened { close(fd) }
        opened = []
        guard result == 0 else {
            closeAll()
            throw Self.failure("posix_spawn \(executable)", result)
        }
        return SpawnedProcess(pid: pid, input: parentEnds[0], output: parentEnds[1], errors: parentEnds[2])
    }
}

extension ChildSpawn {
    static func failure(_ call: String, _ number: Int32) -> BatonError {
        BatonError(.systemCallFailed, "\(call) failed: \(String(cString: strerror(number)))",
                   cause: SystemCallError(call: call, errno: number))
    }
}
