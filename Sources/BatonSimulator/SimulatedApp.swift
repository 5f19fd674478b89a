import Baton
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The app process of the simulation (`baton sim-app`), built the way an app should use Baton:
///
/// - while it runs (foreground or background), it holds the `core` role with the `main`
///   priority, which stops any extension's core, and runs its network core: one connection to
///   the server, every message stored durably before it is acknowledged, then shown;
/// - when told it will be suspended, it closes the connection, releases the role, and calls
///   `container.suspend()`, which releases every lock it holds in the container (presence,
///   role, database), so iOS has no reason to kill it (0xDEAD10CC);
/// - when resumed, it calls `container.resume()` and starts its core again;
/// - in the foreground it shows what extensions stored but could not show.
public struct SimulatedApp: Sendable {
    let container: SharedContainer
    let source: LoopbackMessageSource
    /// A deliberately broken app: ignores suspension and keeps its locks (to test the 0xDEAD10CC rule).
    let keepsLocksWhenSuspended: Bool

    public init(container: SharedContainer, port: UInt16, keepsLocksWhenSuspended: Bool = false) {
        self.container = container
        self.source = LoopbackMessageSource(port: port)
        self.keepsLocksWhenSuspended = keepsLocksWhenSuspended
    }

    /// Runs until standard input closes or an `exit` command arrives.
    public func run() async throws {
        let presence = try container.presence.register(kind: "app")
        defer { presence.release() }
        let role = try container.role("core")
        let store = try InterimMessageStore(container: container)
        ChildChannel.emit(.ready)
        // The core runs in a child task that is started and stopped as the app moves between
        // states; it is always awaited before the app goes on.
        var core: Task<Void, Never>?
        func startCore() {
            core = Task { await runCore(role: role, store: store) }
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
                showUnshown(store)
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

    private func showUnshown(_ store: InterimMessageStore) {
        do {
            for id in try store.unshown() where try store.claimForDisplay(id) {
                ChildChannel.emit(.shown, message: id, detail: "app")
            }
        } catch {
            ChildChannel.emit(.error, detail: "showing stored messages: \(error)")
        }
    }

    /// Holds the role and keeps one connection up until cancelled; reconnects after a drop.
    private func runCore(role: Role, store: InterimMessageStore) async {
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
                    try await source.run(epoch: lease.epoch, receive: { message in
                        try lease.validate()
                        if try store.store(message) { ChildChannel.emit(.stored, message: message.id, detail: "app") }
                        if try store.claimForDisplay(message.id) {
                            ChildChannel.emit(.shown, message: message.id, detail: "app")
                        }
                    }, isDone: { false })
                    delay = .milliseconds(20)
                } catch {
                    if Task.isCancelled { break }
                    try? await Task.sleep(for: delay)
                    delay = min(delay * 2, .milliseconds(500))
                }
            }
            await lease.release()
            ChildChannel.emit(.roleReleased, epoch: lease.epoch, detail: "main")
        }
    }
}
