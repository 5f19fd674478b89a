import ArgumentParser
import Baton
import BatonLoopback
import CBatonShims
import Foundation

/// `baton lifecycle ...`: the connection supervisor, reachability and background time from the
/// command line, plus the loopback test server and the test workers.
struct LifecycleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lifecycle",
        abstract: "Connection supervisor, network reachability and background time.",
        subcommands: [
            ReachabilityCommand.self,
            ExpireCommand.self,
            TestServerCommand.self,
            SuperviseCommand.self,
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

    /// `baton lifecycle test-server`: the loopback test server as a process.
    struct TestServerCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "test-server",
            abstract: "A loopback TCP server that records connections and drops them on command (testing).",
            discussion: "Prints {\"event\":\"listening\",\"port\":N}. Reads commands on standard input: drop, refuse, accept, records (prints every record as JSON), quit.",
            shouldDisplay: false)

        @Option(help: "The port (0: an ephemeral one).") var port: UInt16 = 0

        func run() async throws {
            let server = try LoopbackServer(port: port)
            emit(try jsonLine(JSONValue.object(["event": .string("listening"), "port": .int(Int(server.port))])))
            while let line = readStandardInputLine() {
                switch line.trimmingCharacters(in: .whitespaces) {
                case "drop": emit(try jsonLine(JSONValue.object(["event": .string("dropped"), "count": .int(server.dropAll())])))
                case "refuse": server.refuse(); emit(#"{"event":"refusing"}"#)
                case "accept": try server.accept(); emit(#"{"event":"accepting"}"#)
                case "records":
                    let encoder = JSONEncoder()
                    encoder.outputFormatting = [.sortedKeys]
                    emit(String(decoding: try encoder.encode(server.records), as: UTF8.self))
                case "quit": return
                default: emit(#"{"event":"error","message":"unknown command"}"#)
                }
            }
        }
    }

    /// `baton lifecycle supervise`: a worker that keeps a connection to a loopback server up.
    struct SuperviseCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "supervise",
            abstract: "Keep a connection to a loopback test server up, printing each state as JSON (testing).",
            discussion: "With --handover NAME, the process connects only while it holds the hand-over lock NAME, and yields it to a process of higher --priority.",
            shouldDisplay: false)

        @OptionGroup var options: ContainerOptions
        @Option(help: "The loopback server's port.") var port: UInt16
        @Option(help: "The name the connection gives the server (default: the pid).") var name: String?
        @Option(help: "Connect only while holding this hand-over permit.") var handover: String?
        @Option(help: "Connect only while holding this role (see `baton role`).") var role: String?
        @Option(help: "With --role: main (the app) or executor (an extension).") var rolePriority: String = "executor"
        @Option(help: "Priority for --handover (higher preempts).") var priority: UInt32 = 1
        @Option(help: "Keep-alive ping interval in seconds.", transform: ArgumentCheck.positiveSeconds) var keepAlive: Double = 5

        func run() async throws {
            TerminationSignal.prepare()
            let container = try options.open()
            let permit: any ConnectionPermit
            if let role {
                let isMain = rolePriority == "main"
                permit = RolePermit(try Role(container, name: role), priority: isMain ? .main : .executor, kind: isMain ? "app" : "extension")
            } else if let handover {
                permit = HandoverPermit(container: container, name: handover, priority: priority)
            } else {
                permit = UnrestrictedPermit()
            }
            let port = self.port
            let name = self.name ?? "\(getpid())"
            let supervisor = ConnectionSupervisor(
                container: container, permit: permit,
                configuration: .init(
                    backoff: ConnectionBackoff(initialDelay: .milliseconds(50), maximumDelay: .seconds(1), stablePeriod: .milliseconds(200)),
                    keepAliveInterval: .milliseconds(Int64(keepAlive * 1000)))
            ) {
                try LoopbackClient(port: port, hello: .init(name: name))
            }
            let states = supervisor.states()
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await supervisor.run() }
                group.addTask {
                    for await state in states {
                        var fields: [String: JSONValue] = ["event": .string("state"), "state": .string(Self.label(state)), "pid": .int(Int(getpid()))]
                        if case .waiting = state, let error = supervisor.lastError { fields["error"] = .string("\(error)") }
                        emit(try jsonLine(JSONValue.object(fields)))
                    }
                }
                await TerminationSignal.wait()
                group.cancelAll()
                try await group.waitForAll()
            }
        }

        static func label(_ state: ConnectionState) -> String {
            switch state {
            case .waitingForPermit: return "waitingForPermit"
            case .connecting: return "connecting"
            case .connected: return "connected"
            case .waiting: return "waiting"
            case .stopped: return "stopped"
            }
        }
    }
}
