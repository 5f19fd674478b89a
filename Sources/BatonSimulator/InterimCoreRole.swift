import Baton
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The `core` role of the simulated app and extensions, built on the foundation alone (file
/// locks and signals) while Baton's `Role` is not available on this branch.
///
/// - `sim/core.lock` (exclusive `flock`) is held by whoever runs the core;
/// - `sim/main.lock` is held by the app from the moment it wants the core until it lets go,
///   so an extension sees at once that the app is there (and a dead app at once that it is not);
/// - the app rings `sim.core.stop` after taking `main.lock`; an executor that hears it stops;
/// - each grant increments the epoch in `sim/core.epoch` under the core lock.
///
/// Unlike Baton's `Role`, a holder that ignores a stop request is never overtaken (a `flock`
/// cannot be taken away), which is enough for the simulation's cooperative processes.
final class InterimCoreRole: Sendable {
    static let stopSignal = "sim.core.stop"
    let container: SharedContainer
    private let core: FileLock
    private let main: FileLock

    init(container: SharedContainer) throws {
        self.container = container
        self.core = try FileLock(container, name: "sim/core.lock")
        self.main = try FileLock(container, name: "sim/main.lock")
    }

    /// A grant of the core role.
    final class Lease: Sendable {
        let epoch: UInt64
        private let locks: [HeldFileLock]
        private let observation: SignalObservation?
        private let role: InterimCoreRole

        init(epoch: UInt64, locks: [HeldFileLock], observation: SignalObservation?, role: InterimCoreRole) {
            self.epoch = epoch
            self.locks = locks
            self.observation = observation
            self.role = role
        }

        /// Whether the lease still holds its locks (false after release or suspension).
        var isHeld: Bool { locks.allSatisfy(\.isHeld) }

        /// Returns when the app asks for the core (an executor's lease only; never for the app).
        func stopRequested() async {
            guard let observation else {
                while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
                return
            }
            while !Task.isCancelled {
                if (try? role.isMainPresent()) == true { return }
                _ = try? await observation.next(deadline: .after(.seconds(1)))
            }
        }

        func release() {
            observation?.cancel()
            for lock in locks.reversed() { lock.release() }
        }

        deinit { release() }
    }

    /// The app takes the core: announce, ask any executor to stop, wait for the core lock.
    func acquireMain(deadline: Deadline) async throws -> Lease {
        let announce = try await main.lock(.exclusive, deadline: deadline)
        try container.signals.post(Self.stopSignal)
        let held = try await core.lock(.exclusive, deadline: deadline)
        return Lease(epoch: try nextEpoch(), locks: [announce, held], observation: nil, role: self)
    }

    /// An extension takes the core if neither the app nor another executor has it.
    func tryAcquireExecutor() throws -> Lease? {
        let observation = try container.signals.observe(Self.stopSignal)
        guard try !isMainPresent(), let held = try core.tryLock(.exclusive) else {
            observation.cancel()
            return nil
        }
        // The app may have announced itself between the check and the lock.
        if try isMainPresent() {
            held.release()
            observation.cancel()
            return nil
        }
        return Lease(epoch: try nextEpoch(), locks: [held], observation: observation, role: self)
    }

    /// Whether the app holds or wants the core now.
    func isMainPresent() throws -> Bool {
        guard let probe = try main.tryLock(.shared) else { return true }
        probe.release()
        return false
    }

    private func nextEpoch() throws -> UInt64 {
        let current = try container.readFile("sim/core.epoch").flatMap { UInt64(String(decoding: $0, as: UTF8.self)) } ?? 0
        try container.replaceFile("sim/core.epoch", with: Array(String(current + 1).utf8))
        return current + 1
    }
}
