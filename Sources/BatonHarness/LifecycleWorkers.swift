import ArgumentParser
import Baton
import BatonCommandSupport
import BatonFixtures
import BatonLoopback
import CBatonShims
import Foundation

/// `baton-harness lifecycle ...`: the loopback test server and the supervised-connection worker.
struct LifecycleWorkers: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lifecycle", abstract: "Lifecycle test workers.", subcommands: [TestServerCommand.self, SuperviseCommand.self])

    /// `baton-harness lifecycle test-server`: the loopback test server as a process.
    struct TestServerCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "test-server",
            abstract: "A loopback TCP server that records connections and drops them on command (testing).",
            discussion: "Prints {\"event\":\"listening\",\"port\":N}. Reads commands on standard input: drop, refuse, accept, records (prints every record as JSON), quit.")

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

    /// `baton-harness lifecycle supervise`: a worker that keeps a connection to a loopback server up.
    struct SuperviseCommand: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "supervise",
            abstract: "Keep a connection to a loopback test server up, printing each state as JSON (testing).",
            discussion: "With --handover NAME, the process connects only while it holds the hand-over lock NAME, and yields it to a process of higher --priority.")

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
