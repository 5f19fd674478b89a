import Baton
import BatonDatabase
import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// An extension process of the simulation (`baton sim-extension`): iOS's notification service
/// extension, reused for several pushes, several instances at once (tasks of one process).
///
/// Each instance asks the ``Inbox`` for its own message before its deadline: stored already, it
/// gets it at once; while the app runs its core, it waits for the app to store it; otherwise the
/// process becomes the executor and runs the core until every wanted message is stored (the
/// instances of one process share that run), and stops at once when the app asks for the core.
/// Then it shows the message unless someone already did (exactly one process wins), together
/// with the other messages its executor run received that nobody has shown: the server pushes
/// only while no core is connected, so a message that reached the executor's connection has no
/// push of its own (on iOS the extension groups them into its notification).
public struct SimulatedExtension: Sendable {
    let container: SharedContainer
    let port: UInt16
    /// The system's limit for one instance (iOS: 30 s); the inbox answers `timedOut` a margin before.
    let budget: Duration

    public init(container: SharedContainer, port: UInt16, budget: Duration = .seconds(28)) {
        self.container = container
        self.port = port
        self.budget = budget
    }

    /// The messages this process's executor runs stored and no instance has shown yet.
    final class StoredHere: Sendable {
        let ids = Mutex<Set<String>>([])
    }

    /// Runs until standard input closes or an `exit` command arrives.
    public func run() async throws {
        let role = try container.role("core")
        // Suspends its database as strictly as the rule the simulator enforces requires.
        var databaseConfiguration = SharedDatabase.Configuration()
        databaseConfiguration.suspensionMode = (DeadLockRule.fromEnvironment ?? .strict).databaseSuspensionMode
        let inbox = try await Inbox.open(container: container, databaseConfiguration: databaseConfiguration)
        // The messages this process's executor runs stored, to show with the next notification.
        let storedHere = StoredHere()
        let source = SimulatedCoreSource(port: port, role: role, reportsRole: true) { id in
            storedHere.ids.withLock { _ = $0.insert(id) }
        }
        let ballast = Mutex<[[UInt8]]>([])
        ChildChannel.emit(.ready)
        await withTaskGroup(of: Void.self) { group in
            for await command in ChildChannel.commands() {
                switch command.command {
                case .push:
                    guard let id = command.message else { continue }
                    group.addTask { await instance(for: id, inbox: inbox, source: source, storedHere: storedHere) }
                case .allocate:
                    let bytes = [UInt8](repeating: 1, count: (command.mebibytes ?? 1) << 20)
                    ballast.withLock { $0.append(bytes) }
                case .exit:
                    group.cancelAll()
                    return
                default:
                    break
                }
            }
            group.cancelAll()
        }
    }

    private func instance(for id: String, inbox: Inbox, source: SimulatedCoreSource, storedHere: StoredHere) async {
        ChildChannel.emit(.instanceStarted, message: id)
        defer { ChildChannel.emit(.instanceFinished, message: id) }
        do {
            switch try await inbox.message(id: id, deadline: .after(budget), source: source) {
            case .message(_, let route):
                if try await inbox.claimForDisplay(id: id, by: Demo.claimant("extension")) {
                    ChildChannel.emit(.shown, message: id, detail: "extension (\(route))")
                } else {
                    ChildChannel.emit(.alreadyShown, message: id)
                }
                let others = storedHere.ids.withLock { stored -> Set<String> in
                    defer { stored = [] }
                    return stored.subtracting([id])
                }
                for other in others.sorted() where try await inbox.claimForDisplay(id: other, by: Demo.claimant("extension")) {
                    ChildChannel.emit(.shown, message: other, detail: "extension (grouped with \(id))")
                }
            case .timedOut:
                ChildChannel.emit(.error, message: id, detail: "timed out: generic notification")
            }
        } catch {
            ChildChannel.emit(.error, message: id, detail: "\(error)")
        }
    }
}
