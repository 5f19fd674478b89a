import Baton
import BatonDatabase
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
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
        let inbox = try await Inbox.open(container: container)
        let source = LoopbackMessageSource(port: port, role: role, afterStore: { id in
            await Self.show(id, inbox: inbox)
        })
        ChildChannel.emit(.ready)
        // The core runs in a child task that is started and stopped as the app moves between
        // states; it is always awaited before the app goes on.
        var core: Task<Void, Never>?
        func startCore() {
            core = Task { await runCore(role: role, inbox: inbox, source: source) }
        }
        func stopCore() async {
            core?.cancel()
            await core?.value
            core = nil
        }
        for await command in ChildChannel.commands() {
            switch command.command {
            case .foreground:
                if core == nil && !container.suspension.isSuspended { startCore() }
                await showUnshown(inbox)
            case .background:
                break // keeps running (and connected) until the system suspends it
            case .willSuspend:
                if keepsLocksWhenSuspended {
                    ChildChannel.emit(.releasedLocks, detail: "ignored: this app keeps its locks")
                    continue
                }
                await stopCore()
                await container.suspend()
                ChildChannel.emit(.releasedLocks)
            case .resume:
                do {
                    try await container.resume()
                } catch {
                    ChildChannel.emit(.error, detail: "resume: \(error)")
                }
                if core == nil { startCore() }
            case .exit:
                await stopCore()
                return
            case .push, .allocate:
                break
            }
        }
        await stopCore()
    }

    private static func show(_ id: String, inbox: Inbox) async {
        do {
            if try await inbox.claimForDisplay(id: id, by: "app") {
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

    /// Holds the role and keeps one connection up until cancelled; reconnects after a drop.
    private func runCore(role: Role, inbox: Inbox, source: LoopbackMessageSource) async {
        var delay = Duration.milliseconds(20)
        while !Task.isCancelled {
            let lease: RoleLease
            do {
                lease = try await role.acquire(priority: .main, kind: "app", deadline: .after(.seconds(10)))
            } catch {
                if !Task.isCancelled { ChildChannel.emit(.error, detail: "acquiring the core role: \(error)") }
                try? await Task.sleep(for: delay)
                continue
            }
            ChildChannel.emit(.roleAcquired, epoch: lease.epoch, detail: "main")
            while !Task.isCancelled && lease.isValid {
                do {
                    try await inbox.run(source)
                    delay = .milliseconds(20)
                } catch {
                    if Task.isCancelled { break }
                    try? await Task.sleep(for: delay)
                    delay = min(delay * 2, .milliseconds(500))
                }
            }
            // The connection is closed (the source returned) before the role is released.
            await lease.release()
            ChildChannel.emit(.roleReleased, epoch: lease.epoch, detail: "main")
        }
    }
}
