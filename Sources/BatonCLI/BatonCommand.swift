import ArgumentParser
import Baton
import CBatonShims
import CBatonHarness

@main
struct BatonCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "baton",
        abstract: "Share one container directory safely between processes.",
        subcommands: [
            SignalCommand.self,
            PresenceCommand.self,
            LockCommand.self,
            DatabaseCommand.self,
            DatabaseTestCommand.self,
            ChannelCommand.self,
            RoleCommand.self,
            DefaultsCommand.self,
            InboxCommand.self,
            LifecycleCommand.self,
            BenchCommand.self,
            BenchWorkerCommand.self,
            KernelTestCommand.self, FuzzWorkerCommand.self,
            DemoCommand.self, SimulateCommand.self, SimulatorAppCommand.self, SimulatorExtensionCommand.self,
            SimulatorLockHolderCommand.self, SimulatorGRDBAppCommand.self,
        ]
    )

    static func main() async {
        if environment("BATON_DIE_WITH_PARENT") != nil { _ = baton_exit_with_parent() }
        if let index = ArgumentCheck.firstInvalidUTF8Argument() {
            fail("argument \(index) is not valid UTF-8; names and values must be UTF-8 text (invalid bytes would make two different names the same)")
        }
        do {
            var command = try parseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            let code = exitCode(for: error)
            if code == .validationFailure {
                // One line, without the usage text ArgumentParser adds: the message names the
                // option, and `--help` is there for the rest.
                fail(message(for: error).split(separator: "\n", omittingEmptySubsequences: true).first.map(String.init) ?? "invalid arguments", code: code)
            }
            exit(withError: error)
        }
    }

    /// Prints `Error: <message>` as one line on standard error and exits.
    static func fail(_ message: String, code: ExitCode = .validationFailure) -> Never {
        var line = "Error: " + message
        line.removeAll { $0 == "\n" }
        FileHandleOutput.standardError(line)
        Self.exit(withError: code)
    }
}

/// `--container DIR`, defaulting to `$BATON_CONTAINER`.
struct ContainerOptions: ParsableArguments {
    @Option(name: .long, help: "The shared container directory (default: $BATON_CONTAINER).")
    var container: String?
    @Flag(help: "Accept a container or database that another user owns or may write (refused by default: that user could forge what Baton reads).")
    var trustOtherUsers = false

    func open() throws -> SharedContainer {
        guard let path = container ?? environment("BATON_CONTAINER") else {
            throw ValidationError("no container: pass --container DIR or set BATON_CONTAINER")
        }
        return try SharedContainer(path: path, options: SharedContainer.Options(trustsOtherUsers: trustOtherUsers))
    }
}

func environment(_ name: String) -> String? {
    getenv(name).map { String(cString: $0) }
}

/// Writes a line to standard output and flushes it (the tests read output line by line).
func emit(_ line: String) {
    print(line)
    fflush(nil)
}
