import CBatonShims
import Synchronization

/// How a ``FileLock`` is held.
public enum LockMode: Sendable, Hashable {
    /// Many holders at once.
    case shared
    /// One holder, no shared holders.
    case exclusive

    var flockOperation: Int32 { self == .shared ? LOCK_SH : LOCK_EX }
}

/// A cross-process lock on a file under the container's `.baton` directory (`flock(2)`).
///
/// The kernel releases the lock the instant its holder dies, so a crash never leaves it stuck.
/// Waiting never parks a thread: a waiter sleeps until the kernel reports that the lock file was
/// closed (``FileEvents``, the kernel layer's file watch; every release closes the descriptor),
/// then tries again.
///
/// ```swift
/// let lock = try FileLock(container, name: "migrations.lock")
/// try await lock.withLock(.exclusive, deadline: .after(.seconds(5))) { try migrate() }
/// ```
///
/// Locks are refused while the container is suspended, and every held lock is released when it
/// suspends (no lock may be held by a suspended process).
public struct FileLock: Sendable {
    /// The container the lock file lives in.
    public let container: SharedContainer
    /// The lock file's path relative to `.baton`.
    public let name: String

    /// How long a waiter sleeps at most before trying again even without a close event. Linux
    /// reports a close slightly before it drops the dying process's locks; quick retries after
    /// each event cover that window, and this bounds the rare case where the dying process is
    /// descheduled in between.
    static let backstopInterval: Duration = .milliseconds(200)
    static let retryDelaysAfterEvent: [Duration] = [.zero, .microseconds(50), .microseconds(200), .milliseconds(1), .milliseconds(4)]

    /// A lock on `.baton/<name>`.
    /// - Parameters:
    ///   - container: The shared container.
    ///   - name: A relative path of plain components (`roles/core.lock`); directories are created.
    /// - Throws: `invalidName` for an empty component, `..` or NUL.
    public init(_ container: SharedContainer, name: String) throws {
        let components = name.split(separator: "/", omittingEmptySubsequences: false)
        for component in components {
            try SharedContainer.validateName(String(component), what: "a lock file name component")
        }
        var directory = ""
        for component in components.dropLast() {
            directory += directory.isEmpty ? String(component) : "/" + component
            try container.makeDirectory(directory)
        }
        self.container = container
        self.name = name
    }

    /// Takes the lock if nobody holds it in a conflicting mode; `nil` otherwise.
    public func tryLock(_ mode: LockMode = .exclusive) throws -> HeldFileLock? {
        try container.suspension.checkActive("take the lock \(name)")
        let file = try container.openDescriptor(name, flags: O_RDWR | O_CREAT)
        guard try Sys.tryFlock(file.rawValue, mode.flockOperation).get("locking \(name)") else { return nil }
        // From here the held lock owns the descriptor (closed by it, even when this throws).
        return try granted(file, mode)
    }

    /// Waits for the lock.
    /// - Parameters:
    ///   - mode: Shared or exclusive.
    ///   - deadline: When to give up with `timedOut`.
    /// - Throws: `timedOut`, `suspended`, `CancellationError`, or a system error.
    public func lock(_ mode: LockMode = .exclusive, deadline: Deadline) async throws -> HeldFileLock {
        try container.suspension.checkActive("take the lock \(name)")
        let file = try container.openDescriptor(name, flags: O_RDWR | O_CREAT)
        let fd = file.rawValue
        let subscription = try FileEvents.shared.subscribe(path: container.absolutePath(name), interest: .lockReleased)
        let operation = mode.flockOperation
        while true {
            let seen = subscription.events.snapshot()
            if try Sys.tryFlock(fd, operation).get("locking \(name)") {
                return try granted(file, mode)
            }
            try container.suspension.checkActive("take the lock \(name)")
            let slice = deadline.earliest(.after(Self.backstopInterval))
            do {
                try await subscription.events.wait(after: seen, deadline: slice)
            } catch let error as BatonError where error.code == .timedOut {
                if deadline.hasPassed {
                    throw BatonError(.timedOut, "timed out waiting for the lock \(name); another process holds it")
                }
                continue
            }
            for delay in Self.retryDelaysAfterEvent {
                if delay > .zero { try await Task.sleep(for: delay) }
                if try Sys.tryFlock(fd, operation).get("locking \(name)") {
                    return try granted(file, mode)
                }
            }
        }
    }

    /// Wraps a descriptor just locked. A suspension (or expiry) that began while the lock was
    /// being taken may have missed it: the lock is then released at once and `suspended`
    /// thrown, so a suspended process never holds a lock. (The registration with the
    /// suspension controller happens before the check, so one of the two always sees the other.)
    private func granted(_ file: consuming FileDescriptor, _ mode: LockMode) throws -> HeldFileLock {
        let held = HeldFileLock(file, lock: self, mode: mode)
        if container.suspension.isSuspended {
            held.release()
            throw BatonError(.suspended, "the lock \(name) was released at once: the process was suspended while taking it; call resume() first")
        }
        return held
    }

    /// Runs `body` holding the lock, and releases it afterwards even when `body` throws or the
    /// task is cancelled.
    public func withLock<R>(
        _ mode: LockMode = .exclusive,
        deadline: Deadline,
        _ body: () async throws -> R
    ) async throws -> R {
        let held = try await lock(mode, deadline: deadline)
        defer { held.release() }
        return try await body()
    }
}

/// A held ``FileLock``. Released by ``release()``, by deinit, or by the container's suspension
/// (`LOCK_UN`, then close: see `Sys.unlockAndClose`).
public final class HeldFileLock: Sendable {
    private struct State: ~Copyable {
        /// The locked file; nil once released.
        var file: FileDescriptor?
        var token: SuspensionController.RegistrationToken?
    }
    private let state: Mutex<State>
    /// The lock this holds.
    public let lock: FileLock
    /// The mode it is held in.
    public let mode: LockMode

    init(_ file: consuming FileDescriptor, lock: FileLock, mode: LockMode) {
        self.state = Mutex(State(file: file, token: nil))
        self.lock = lock
        self.mode = mode
        let token = lock.container.suspension.register(SuspensionRelease(self))
        state.withLock { $0.token = token }
    }

    /// Whether the lock is still held (false after release or suspension).
    public var isHeld: Bool { state.withLock { $0.file != nil } }

    /// The descriptor while held (for the tests' lock inspection and advanced use).
    package var descriptor: Int32? { state.withLock { $0.file?.rawValue } }

    /// Releases the lock (closing the descriptor). Safe to call more than once.
    public func release() {
        var released = state.withLock { state -> State in
            State(file: state.file.take(), token: state.token.take())
        }
        if let token = released.token { lock.container.suspension.unregister(token) }
        released.file.take()?.unlockAndClose()
    }

    deinit { release() }

    private final class SuspensionRelease: SuspensionParticipant {
        weak let held: HeldFileLock?
        init(_ held: HeldFileLock) { self.held = held }
        func suspend() async { held?.release() }
        func resume() async throws {}
    }
}
