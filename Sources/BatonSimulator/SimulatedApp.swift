import Baton
import BatonDatabase
import BatonLoopback
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

/// The app process of the simulation (`baton sim-app`), built the way an app should use Baton:
///
/// - while it runs (foreground or background), it holds the `core` role with the `main`
///   priority, which stops any extension's core, and runs its network core through the
///   ``Inbox``: every message is stored durably before it is acknowledged, then shown (claimed
///   for display, so it is shown once across all processes);
/// - when told it will be suspended, it closes the connection, releases the role, and calls
///   `container.suspend()`, which releases every lock it holds in the container (presence,
///   role, the inbox's database), so iOS has no reason to kill it (0xDEAD10CC);
/// - when resumed, it calls `container.resume()` and starts its core again;
/// - in the foreground it shows what extensions stored but could not show.
public struct SimulatedApp: Sendable {
    let container: SharedContainer
    let port: UInt16
    /// A deliberately broken app: ignores suspension and keeps its locks (to test the 0xDEAD10CC rule).
    let keepsLocksWhenSuspended: Bool

    public init(container: SharedContainer, port: UInt16, keepsLocksWhenSuspended: Bool = false) {
        self.container = container
        self.port = port
        self.keepsLocksWhenSuspended = keepsLocksWhenSuspended
    }

    /// Runs until standard input closes or an `exit` command arrives.
    public func run() async throws {
        let presence = try container.presence.register(kind: "app")
        defer { presence.release() }
        let role = try container.role("core")
        // Suspends its database as strictly as the rule the simulator enforces requires.
        var databaseConfiguration = SharedDatabase.Configuration()
        databaseConfiguration.suspensionMode = (DeadLockRule.fromEnvironment ?? .strict).databaseSuspensionMode
        let inbox = try await Inbox.open(container: container, databaseConfiguration: databaseConfiguration)
        // The network core: a supervisor keeps one connection up while this process holds the
        // `core` role (main priority), reconnects at once after a drop, and on suspension
        // closes the connection before any lock of the container is released.
        let permit = ReportedPermit(RolePermit(role, priority: .main, kind: "app"), label: "main")
        let (connections, newConnection) = AsyncStream.makeStream(of: (client: LoopbackClient, epoch: UInt64).self)
        let supervisor = ConnectionSupervisor(
            container: container,
            permit: permit,
            configuration: .init(backoff: ConnectionBackoff(initialDelay: .milliseconds(50), maximumDelay: .seconds(1)), keepAliveInterval: .seconds(5), connectTimeout: .seconds(5))
        ) { [port] in
            let epoch = (try? role.status().epoch) ?? 0
            let client = try LoopbackClient(port: port, hello: .init(name: "app", epoch: epoch))
            ChildChannel.emit(.connected, epoch: epoch)
            newConnection.yield((client, epoch))
            return client
        }
        ChildChannel.emit(.ready)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await supervisor.run() }
            group.addTask {
                // Each connection's messages, stored then acknowledged in order.
                for await (client, epoch) in connections {
                    await Self.receive(client, epoch: epoch, inbox: inbox)
                }
            }
            commands: for await command in ChildChannel.commands() {
                switch command.command {
                case .foreground:
                    if !container.suspension.isSuspended { await showUnshown(inbox) }
                case .background:
                    break // keeps running (and connected) until the system suspends it
                case .willSuspend:
                    if keepsLocksWhenSuspended {
                        ChildChannel.emit(.releasedLocks, detail: "ignored: this app keeps its locks")
                        continue
                    }
                    // Closes the connection, releases the role, closes the database, drops presence.
                    await container.suspend()
                    ChildChannel.emit(.releasedLocks)
                case .resume:
                    do {
                        try await container.resume()
                    } catch {
                        ChildChannel.emit(.error, detail: "resume: \(error)")
                    }
                case .exit:
                    break commands
                case .push, .allocate, .timeWillExpire:
                    break
                }
            }
            newConnection.finish()
            group.cancelAll()
            try await group.waitForAll()
        }
    }

    /// Stores each message the server sends, and acknowledges it after that; a message that
    /// cannot be stored is not acknowledged and the connection is closed, so the server
    /// delivers it again to the next core.
    private static func receive(_ client: LoopbackClient, epoch: UInt64, inbox: Inbox) async {
        defer { ChildChannel.emit(.disconnected, epoch: epoch) }
        for await line in client.incoming {
            guard case .message(let message) = line else { continue }
            do {
                if try await inbox.store(IncomingMessage(id: message.id, payload: Data(message.payload))) {
                    ChildChannel.emit(.stored, message: message.id, detail: "app")
                }
            } catch {
                await client.close()
                return
            }
            client.send(.ack(id: message.id))
            await show(message.id, inbox: inbox)
        }
    }

    private static func show(_ id: String, inbox: Inbox) async {
        do {
            if try await inbox.claimForDisplay(id: id, by: Demo.claimant("app")) {
                ChildChannel.emit(.shown, message: id, detail: "app")
            }
        } catch {
            ChildChannel.emit(.error, message: id, detail: "claiming for display: \(error)")
        }
    }

    private func showUnshown(_ inbox: Inbox) async {
        do {
            for message in try await inbox.messages() where !message.isShown {
                await Self.show(message.id, inbox: inbox)
            }
        } catch {
            ChildChannel.emit(.error, detail: "listing stored messages: \(error)")
        }
    }
}
