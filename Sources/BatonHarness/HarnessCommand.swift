import ArgumentParser
import BatonBench
import BatonCommandSupport

/// `baton-harness`: the worker processes of Baton's own tests, benchmarks and failure drills,
/// kept out of the user-facing `baton`.
///
/// Tests spawn it through `ChildProcess(harness:)` (`$BATON_HARNESS_EXECUTABLE`, else
/// `baton-harness` next to the test bundle); `baton bench` spawns its `bench-worker`s from the
/// `baton-harness` next to `baton` (see `harnessExecutable()`). Each group keeps the path it had
/// under `baton` (`defaults test-writer`, `channel test-worker produce`, ...).
@main
struct HarnessCommand: BatonRootCommand {
    static let configuration = CommandConfiguration(
        commandName: "baton-harness",
        abstract: "Worker processes for Baton's own tests and benchmarks (not a user command).",
        subcommands: [
            DefaultsWorkers.self,
            ChannelWorkers.self,
            RoleWorkers.self,
            LifecycleWorkers.self,
            InboxWorkers.self,
            DatabaseTestCommand.self,
            KernelTestCommand.self,
            FuzzWorkerCommand.self,
            SimulatorLockHolderCommand.self,
            SimulatorGRDBAppCommand.self,
            BenchWorkerCommand.self,
        ]
    )

    static func main() async { await runMain() }
}
