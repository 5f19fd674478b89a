import ArgumentParser
import Baton
import BatonCommandSupport
import BatonLoopback
import CBatonShims
import Foundation

/// `baton lifecycle ...`: the connection supervisor, reachability and background time from the
/// command line (the loopback test server and its workers are in `baton-harness lifecycle`).
struct LifecycleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lifecycle",
        abstract: "Connection supervisor, network reachability and background time.",
        subcommands: [
            ReachabilityCommand.self,
            ExpireCommand.self,
        ]
    )

    /// `baton lifecycle reachability`: prints the network path and every rtnetlink change.
    struct ReachabilityCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "reachability",
            abstract: "Print the network path, then one JSON line per kernel change (rtnetlink), until interrupted.")

        @Option(help: "Stop after this many seconds (default: run until SIGTERM/SIGINT).", transform: ArgumentCheck.seconds) var seconds: Double?

        func run() async throws {
            TerminationSignal.prepare()
            let monitor = try NetlinkReachability()
            let messages = monitor.messages()
            let updates = monitor.updates()
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await path in updates {
                        emit((try? jsonLine(JSONValue.object([
                            "event": .string("path"), "status": .string(path.status.rawValue),
                            "interfaces": .array(path.interfaces.map { .string($0) }),
                            "generation": .int(Int(path.generation)),
                        ]))) ?? "")
                    }
                }
                group.addTask {
                    for await message in messages {
                        emit((try? jsonLine(JSONValue.object([
                            "event": .string("message"), "kind": .string(message.kind.rawValue),
                            "interface": .int(Int(message.interfaceIndex)),
                            "address": message.address.map { .string($0) } ?? .null,
                        ]))) ?? "")
                    }
                }
                if let seconds {
                    try? await Task.sleep(for: .milliseconds(Int64(seconds * 1000)))
                } else {
                    await TerminationSignal.wait()
                }
                group.cancelAll()
            }
        }
    }

    /// `baton lifecycle expire --pid N`: the simulator's "background time is up".
    struct ExpireCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "expire",
            abstract: "Tell process PID that its background time is up (its SignalledBackgroundTasks expire).")

        @OptionGroup var options: ContainerOptions
        @Option(help: "The process whose background time ends.") var pid: Int32

        func run() async throws {
            let container = try options.open()
            guard pid > 0 else { throw ValidationError("--pid must be a process id (1 or more)") }
            if kill(pid, 0) != 0, errno == ESRCH {
                throw CommandOutcome(.notFound, "not found: no process \(pid) is running; its background time cannot end")
            }
            try container.signals.post(SignalledBackgroundTasks.signalName(pid: pid))
            emit(try jsonLine(JSONValue.object(["event": .string("expired"), "pid": .int(Int(pid))])))
        }
    }
}
