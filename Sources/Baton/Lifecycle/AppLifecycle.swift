import Synchronization

/// Suspends Baton when the app leaves the foreground, and resumes it on return.
///
/// iOS freezes a backgrounded app within seconds, and kills a frozen process that holds a file
/// lock in a shared container (0xDEAD10CC). Feed this the app's lifecycle (the UIKit and SwiftUI
/// adapters do it for you) and it calls ``SharedContainer/suspend()`` when the app goes to the
/// background or its background time is about to expire, and ``SharedContainer/resume()`` when
/// it comes back. The container's suspension reaches every registered participant: presence,
/// roles, held file locks, and every `SharedDatabase` opened on the container.
///
/// ```swift
/// let lifecycle = AppLifecycle(container: container)
/// await lifecycle.phaseChanged(to: .background)   // locks released before the app is frozen
/// await lifecycle.phaseChanged(to: .active)       // taken back, or learnt lost
/// ```
///
/// Transitions are applied one at a time, in the order they were asked for; a call returns
/// once the state it asked for (or a later one) is in force, so `await`ing the background
/// transition guarantees no lock is held when it returns. Calls from several tasks are safe.
public final class AppLifecycle: Sendable {
    /// Where the app is, as far as Baton cares.
    public enum Phase: Sendable, Hashable {
        /// In the foreground and receiving events.
        case active
        /// In the foreground, not receiving events (a system alert, the app switcher).
        case inactive
        /// In the background: about to be frozen.
        case background
    }

    /// The container this lifecycle suspends.
    public let container: SharedContainer
    private let onResumeFailure: (@Sendable (any Error) -> Void)?
    private let machine = Mutex(LifecycleStateMachine())

    /// - Parameters:
    ///   - container: The container to suspend and resume (with every participant registered
    ///     on it, databases included).
    ///   - onResumeFailure: Called when resuming throws, for example because a role was taken
    ///     over while the app was in the background. The container is resumed nevertheless.
    public init(container: SharedContainer, onResumeFailure: (@Sendable (any Error) -> Void)? = nil) {
        self.container = container
        self.onResumeFailure = onResumeFailure
    }

    /// Whether this lifecycle currently holds the container suspended.
    public var isSuspended: Bool { machine.withLock { $0.applied == .suspended } }

    /// The app moved to `phase`. Background suspends; active and inactive resume.
    public func phaseChanged(to phase: Phase) async {
        await request(phase == .background ? .suspended : .running)
    }

    /// The app's background time (or a background task's) is about to expire: suspend now.
    public func backgroundTimeWillExpire() async { await request(.suspended) }

    /// A notification service extension is about to handle a request (`didReceive`): resume,
    /// in case an earlier request of this process ended in ``extensionTimeWillExpire()``
    /// (iOS reuses extension processes).
    public func extensionWillHandleRequest() async { await request(.running) }

    /// A notification service extension's time is up (`serviceExtensionTimeWillExpire`), or it
    /// delivered its content: suspend before iOS freezes the process.
    public func extensionTimeWillExpire() async { await request(.suspended) }

    private func request(_ target: LifecycleStateMachine.Target) async {
        guard machine.withLock({ $0.request(target) }) else {
            // Another call is applying transitions; it runs until ours is in force.
            await withCheckedContinuation { continuation in
                let ready = machine.withLock { $0.waitUnlessIdle(continuation) }
                if ready { continuation.resume() }
            }
            return
        }
        while true {
            switch machine.withLock({ $0.next() }) {
            case .suspend:
                await container.suspend()
            case .resume:
                do { try await container.resume() } catch { onResumeFailure?(error) }
            case .done(let waiters):
                for waiter in waiters { waiter.resume() }
                return
            }
        }
    }
}

/// The transitions of ``AppLifecycle``: what is in force, what was last asked for, and who
/// applies the difference. Pure; the lifecycle runs its actions outside the lock.
struct LifecycleStateMachine {
    enum Target: Equatable { case running, suspended }

    enum Step {
        case suspend
        case resume
        /// Nothing left to apply; resume these waiting callers.
        case done([CheckedContinuation<Void, Never>])
    }

    private(set) var applied = Target.running
    private(set) var desired = Target.running
    private var applying = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    /// Records the target. True when the caller must apply transitions (nobody else is).
    mutating func request(_ target: Target) -> Bool {
        desired = target
        if applying { return false }
        applying = true
        return true
    }

    /// Queues a caller until the applier is done; false when it already is.
    mutating func waitUnlessIdle(_ continuation: CheckedContinuation<Void, Never>) -> Bool {
        guard applying else { return true }
        waiters.append(continuation)
        return false
    }

    /// The next transition to apply, marked as applied.
    mutating func next() -> Step {
        guard applied != desired else {
            applying = false
            defer { waiters = [] }
            return .done(waiters)
        }
        applied = desired
        return applied == .suspended ? .suspend : .resume
    }
}
