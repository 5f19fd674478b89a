import CBatonShims
import Synchronization

/// Something that holds kernel locks and must let go of them before the process is suspended.
///
/// Baton's own parts (presence, roles, the shared database) register themselves with their
/// container's ``SuspensionController``; an app can register its own.
public protocol SuspensionParticipant: AnyObject, Sendable {
    /// Releases every kernel lock this participant holds. Called once per suspension.
    func suspend() async
    /// Takes back what ``suspend()`` released, or records that it was lost.
    func resume() async throws
}

/// The process-wide suspension state of one ``SharedContainer``.
///
/// iOS kills a suspended process that holds a file lock in a shared container (0xDEAD10CC).
/// ``suspend()`` makes every registered participant release its locks, and makes new lock
/// acquisitions through Baton fail with `suspended` until ``resume()``. Calls nest.
/// After ``expire()`` (the system said time is up), a late ``resume()`` does not undo it.
public final class SuspensionController: Sendable {
    private struct State {
        var depth = 0
        var expired = false
        var nextID: UInt64 = 0
        var participants: [(id: UInt64, participant: any SuspensionParticipant)] = []
    }

    private let state = Mutex(State())
    /// Moves on every transition, for waits that must end when the process suspends.
    let transitions = EventCounter()

    init() {}

    /// Whether the process is currently suspended (or expired).
    public var isSuspended: Bool { state.withLock { $0.depth > 0 || $0.expired } }

    /// Whether ``expire()`` was called.
    public var isExpired: Bool { state.withLock { $0.expired } }

    /// Registers a participant; keep the token to unregister.
    public func register(_ participant: any SuspensionParticipant) -> RegistrationToken {
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            state.participants.append((state.nextID, participant))
            return state.nextID
        }
        return RegistrationToken(id: id)
    }

    /// Removes a participant.
    public func unregister(_ token: RegistrationToken) {
        state.withLock { $0.participants.removeAll { $0.id == token.id } }
    }

    /// Identifies a registration.
    public struct RegistrationToken: Sendable, Hashable {
        let id: UInt64
    }

    /// Releases every lock of every participant (newest first). Nested calls only count.
    public func suspend() async {
        let toSuspend = state.withLock { state -> [any SuspensionParticipant] in
            state.depth += 1
            return state.depth == 1 && !state.expired ? state.participants.reversed().map(\.participant) : []
        }
        for participant in toSuspend { await participant.suspend() }
        transitions.notify()
    }

    /// Ends one ``suspend()``; the last one resumes every participant (oldest first).
    /// After ``expire()`` this does nothing.
    /// - Throws: The first participant error (for example a role lost while suspended); the
    ///   other participants are still resumed.
    public func resume() async throws {
        let toResume = state.withLock { state -> [any SuspensionParticipant] in
            guard state.depth > 0 else { return [] }
            state.depth -= 1
            return state.depth == 0 && !state.expired ? state.participants.map(\.participant) : []
        }
        var firstError: (any Error)?
        for participant in toResume {
            do { try await participant.resume() } catch { firstError = firstError ?? error }
        }
        transitions.notify()
        if let firstError { throw firstError }
    }

    /// The system is about to end the process: suspend for good. Later resumes do nothing.
    public func expire() async {
        let toSuspend = state.withLock { state -> [any SuspensionParticipant] in
            let wasActive = state.depth == 0 && !state.expired
            state.expired = true
            return wasActive ? state.participants.reversed().map(\.participant) : []
        }
        for participant in toSuspend { await participant.suspend() }
        transitions.notify()
    }

    /// Throws `suspended` when the process is suspended: call before taking any lock.
    public func checkActive(_ doing: @autoclosure () -> String) throws {
        if isSuspended {
            throw BatonError(.suspended, "cannot \(doing()) while the process is suspended; call resume() first")
        }
    }
}
