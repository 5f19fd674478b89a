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
            KernelTestCommand.self,
            DemoCommand.self, SimulateCommand.self, SimulatorAppCommand.self, SimulatorExtensionCommand.self,
            SimulatorLockHolderCommand.self, SimulatorGRDBAppCommand.self,
        ]
    )

    static func main() async {
        if environment("BATON_DIE_WITH_PARENT") != nil { _ = baton_exit_with_parent() }
        do {
            var command = try parseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            exit(withError: error)
        }
    }
}

/// `--container DIR`, defaulting to `$BATON_CONTAINER`.
struct ContainerOptions: ParsableArguments {
    @Option(name: .long, help: "The shared container directory (default: $BATON_CONTAINER).")
    var container: String?

    func open() throws -> SharedContainer {
        guard let path = container ?? environment("BATON_CONTAINER") else {
            throw ValidationError("no container: pass --container DIR or set BATON_CONTAINER")
        }
        return try SharedContainer(path: path)
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
