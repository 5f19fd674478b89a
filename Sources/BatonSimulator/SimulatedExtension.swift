import Baton
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An extension process of the simulation (`baton sim-extension`): iOS's notification service
/// extension, reused for several pushes, several instances at once (tasks of one process).
///
/// Each instance wants the content of its own message before its deadline:
/// 1. already stored: take it;
/// 2. the app holds the core: wait for the app to store it;
/// 3. otherwise become the executor: take the `core` role with the `executor` priority, run
///    the core until every wanted message is stored and the server has nothing pending; the
///    instances of one process share that one run;
/// 4. the app asks for the core mid-run: stop at once and go on as in 2.
/// Then it shows the message if nobody has (exactly one process wins).
public struct SimulatedExtension: Sendable {
    let container: SharedContainer
    let source: LoopbackMessageSource
    /// How long an instance may look for its message before it shows a generic notification.
    let patience: Duration

    public init(container: SharedContainer, port: UInt16, patience: Duration = .seconds(25)) {
        self.container = container
        self.source = LoopbackMessageSource(port: port)
        self.patience = patience
    }

    /// The wanted messages and the executor run shared by the instances of this process.
    final class Executor: Sendable {
        struct State {
            var wanted: Set<String> = []
            var running = false
        }
        let state = Mutex(State())
    }

    /// Runs until standard input closes or an `exit` command arrives.
    public func run() async throws {
        let role = try container.role("core")
        let store = try InterimMessageStore(container: container)
        let executor = Executor()
        let ballast = Mutex<[[UInt8]]>([])
        ChildChannel.emit(.ready)
        await withTaskGroup(of: Void.self) { group in
            for await command in ChildChannel.commands() {
                switch command.command {
                case .push:
                    guard let id = command.message else { continue }
                    group.addTask {
                        await instance(for: id, role: role, store: store, executor: executor)
                    }
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

    private func instance(for id: String, role: Role, store: InterimMessageStore, executor: Executor) async {
        ChildChannel.emit(.instanceStarted, message: id)
        defer { ChildChannel.emit(.instanceFinished, message: id) }
        let deadline = Deadline.after(patience)
        do {
            if try await message(id, deadline: deadline, role: role, store: store, executor: executor) {
                if try store.claimForDisplay(id) {
                    ChildChannel.emit(.shown, message: id, detail: "extension")
                } else {
                    ChildChannel.emit(.alreadyShown, message: id)
                }
            } else {
                ChildChannel.emit(.error, message: id, detail: "timed out: generic notification")
            }
        } catch {
            ChildChannel.emit(.error, message: id, detail: "\(error)")
        }
    }

    /// Steps 1 to 4 of the type's description; false at the deadline.
    private func message(_ id: String, deadline: Deadline, role: Role, store: InterimMessageStore, executor: Executor) async throws -> Bool {
        let stored = try container.signals.observe(InterimMessageStore.signal)
        defer { stored.cancel() }
        executor.state.withLock { _ = $0.wanted.insert(id) }
        defer { executor.state.withLock { _ = $0.wanted.remove(id) } }
        while !deadline.hasPassed {
            try Task.checkCancellation()
            if try store.contains(id) { return true }
            let runHere = executor.state.withLock { state -> Bool in
                guard !state.running else { return false }
                state.running = true
                return true
            }
            if runHere {
                defer { executor.state.withLock { $0.running = false } }
                if try !Self.appHasCore(role), let lease = try? await role.acquire(priority: .executor, kind: "extension", deadline: deadline.earliest(.after(.milliseconds(300)))) {
                    await runExecutor(lease: lease, store: store, executor: executor, deadline: deadline)
                    continue
                }
            }
            // The app (or another executor) runs the core: wait for a store, briefly.
            _ = try? await stored.next(deadline: deadline.earliest(.after(.milliseconds(250))))
        }
        return try store.contains(id)
    }

    /// Whether the app holds the core or waits for it.
    static func appHasCore(_ role: Role) throws -> Bool {
        let status = try role.status()
        return status.holder.map { $0.priority >= .main } == true || status.waiters.contains { $0.priority >= .main }
    }

    /// Runs the core as the executor until every wanted message is stored and the server is idle,
    /// the app asks for the core, or the deadline passes.
    private func runExecutor(lease: RoleLease, store: InterimMessageStore, executor: Executor, deadline: Deadline) async {
        ChildChannel.emit(.roleAcquired, epoch: lease.epoch, detail: "executor")
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                do {
                    try await source.run(epoch: lease.epoch, receive: { message in
                        try lease.validate()
                        if try store.store(message) { ChildChannel.emit(.stored, message: message.id, detail: "executor") }
                    }, isDone: {
                        let wanted = executor.state.withLock { $0.wanted }
                        return wanted.allSatisfy { (try? store.contains($0)) == true }
                    })
                } catch {
                    if !Task.isCancelled { ChildChannel.emit(.error, detail: "executor core: \(error)") }
                }
            }
            group.addTask {
                // The app asked for the core (or the lease ended): stop the source at once.
                for await _ in lease.stopRequests { break }
            }
            group.addTask { try? await Task.sleep(for: deadline.remaining ?? .seconds(30)) }
            await group.next()
            group.cancelAll()
        }
        // The connection is closed (the source task ended) before the role is released.
        await lease.release()
        ChildChannel.emit(.roleReleased, epoch: lease.epoch, detail: "executor")
    }
}
