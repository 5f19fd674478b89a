import ArgumentParser
import Baton
import BatonBench
import BatonCommandSupport
import BatonSimulator
import CBatonShims
import CBatonHarness

@main
struct BatonCommand: BatonRootCommand {
    static let configuration = CommandConfiguration(
        commandName: "baton",
        abstract: "Share one container directory safely between processes.",
        discussion: """
            Every subcommand exits with one of these statuses (an absence or a timeout also \
            prints one line on standard error):

            \(ExitStatus.table)

            JSON output (--json) uses snake_case keys and ISO 8601 times.
            """,
        subcommands: [
            SignalCommand.self,
            PresenceCommand.self,
            LockCommand.self,
            DatabaseCommand.self,
            ChannelCommand.self,
            RoleCommand.self,
            DefaultsCommand.self,
            InboxCommand.self,
            LifecycleCommand.self,
            BenchCommand.self,
            InspectCommand.self,
            DemoCommand.self, SimulateCommand.self, SimulatorAppCommand.self, SimulatorExtensionCommand.self,
        ]
    )

    static func main() async { await runMain() }
}
