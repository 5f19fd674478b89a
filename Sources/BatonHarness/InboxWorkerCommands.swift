import ArgumentParser
import Baton
import BatonCommandSupport
import BatonDatabase
import BatonLoopback
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// `baton-harness inbox ...`: the inbox tests' loopback message server and worker processes.
struct InboxWorkers: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "inbox", abstract: "Inbox test workers.", subcommands: [Loopback.self, AppWorker.self, ExtensionWorker.self])
}

extension InboxWorkers {
    /// `baton-harness inbox loopback serve|push|stats|delay`: the test message server.
    struct Loopback: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "The loopback message server of the inbox's tests.",
            
            subcommands: [Serve.self, Push.self, Stats.self])

        struct Serve: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Serve on 127.0.0.1; prints `listening PORT`.")
            @Option(help: "Wait this long before each delivery to a core (ms).", transform: ArgumentCheck.count) var delayMs: Int = 0

            func run() throws {
                let server = try LoopbackServer(delayMilliseconds: delayMs)
                emit("listening \(server.port)")
                server.serve()
            }
        }

        struct Push: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Push messages ID=PAYLOAD to the server.")
            @Option var port: UInt16
            @Argument(help: "ID=PAYLOAD pairs.") var messages: [String]

            func run() throws {
                for pair in messages {
                    let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
                    guard parts.count == 2 else { throw ValidationError("expected ID=PAYLOAD, got \(pair)") }
                    let reply = try LoopbackClient.command(.push(id: parts[0], payload: Array(parts[1].utf8)), port: port)
                    guard reply == "OK" else { throw ValidationError("the server said \(reply)") }
                }
                emit("pushed \(messages.count)")
            }
        }

        struct Stats: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Print the server's counters as JSON.")
            @Option var port: UInt16

            func run() throws {
                let reply = try LoopbackClient.command(.stats, port: port)
                var object: [String: JSONValue] = [:]
                for field in reply.split(separator: " ").dropFirst() {
                    let parts = field.split(separator: "=")
                    if parts.count == 2, let value = Int(parts[1]) { object[String(parts[0])] = .int(value) }
                }
                emit(try jsonLine(JSONValue.object(object)))
            }
        }
    }

    /// `baton-harness inbox app --port P`: an app holding the main role and running its core.
    struct AppWorker: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "app",
            abstract: "Acquire the main role and run a core against the loopback server until SIGTERM.")
        @OptionGroup var options: InboxOptions
        @Option var port: UInt16
        @Option(help: "Give up acquiring the role after this many seconds.", transform: ArgumentCheck.seconds) var timeout: Double = 30

        func run() async throws {
            TerminationSignal.prepare()
            let container = try options.container.open()
            let inbox = try await options.open()
            let role = try Role(container, name: inbox.configuration.roleName)
            let lease = try await role.acquire(priority: .main, kind: "app", deadline: .seconds(timeout))
            emit(try jsonLine(JSONValue.object(["event": .string("main"), "epoch": .int(Int(lease.epoch))])))
            let source = LoopbackMessageSource(port: port) { event in
                emit((try? jsonLine(JSONValue.object(["event": .string(event)]))) ?? event)
            }
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await inbox.run(source) }
                group.addTask { await TerminationSignal.wait() }
                _ = try await group.next()
                group.cancelAll()
            }
            await lease.release()
            emit(try jsonLine(JSONValue.object(["event": .string("released")])))
        }
    }

    /// `baton-harness inbox extension --port P ID...`: an extension process with one instance per id.
    /// Each instance opens its own `Inbox`, calls `message(id:deadline:source:)`, then
    /// `claimForDisplay`, and prints one JSON line.
    struct ExtensionWorker: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "extension",
            abstract: "Get messages as a notification service extension would.")
        @OptionGroup var options: InboxOptions
        @Option(help: "The loopback server's port; without it, only wait for the store.") var port: UInt16?
        @Option(help: "The system's limit in seconds.", transform: ArgumentCheck.seconds) var timeout: Double = 30
        @Option(help: "Give up this long before the limit (seconds).", transform: ArgumentCheck.seconds) var margin: Double = 2
        @Flag(help: "Do not claim the messages for display.") var noClaim = false
        @Argument(help: "The message ids, one instance each.") var ids: [String]

        func run() async throws {
            let deadline = try Deadline.seconds(timeout)
            let configuration = InboxConfiguration(timeoutMargin: .milliseconds(Int64(margin * 1000)))
            let source = port.map { port in
                LoopbackMessageSource(port: port) { event in
                    emit((try? jsonLine(JSONValue.object(["event": .string(event)]))) ?? event)
                }
            }
            let options = self.options
            let claim = !noClaim
            let timedOut = try await withThrowingTaskGroup(of: Bool.self) { group in
                for id in ids {
                    group.addTask {
                        let inbox = try await options.open(configuration: configuration)
                        switch try await inbox.message(id: id, deadline: deadline, source: source) {
                        case .message(let message, let route):
                            let shown = claim ? try await inbox.claimForDisplay(id: id) : false
                            emit(try jsonLine(JSONValue.object([
                                "event": .string("message"), "id": .string(id), "route": .string(route.rawValue),
                                "shown": .bool(shown), "payload": .string(String(decoding: message.payload, as: UTF8.self)),
                            ])))
                            return false
                        case .timedOut:
                            emit(try jsonLine(JSONValue.object(["event": .string("timedOut"), "id": .string(id)])))
                            return true
                        }
                    }
                }
                var any = false
                for try await result in group { any = any || result }
                return any
            }
            if timedOut { throw CommandOutcome(.timedOut, "timed out: a message was not handled before the extension's deadline") }
        }
    }
}
