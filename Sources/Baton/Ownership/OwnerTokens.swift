import CBatonShims
import Synchronization

/// Identities of live processes in a container, vouched for by the kernel.
///
/// A process that needs to own something in shared memory (a lock word, a signal-table entry, a
/// channel element it took, a writer-queue ticket) records its *owner token* there: a random
/// 63-bit number with a file `.baton/owners/<token>` that the process keeps open with an
/// exclusive `flock`. The kernel releases that lock the instant the process dies, so anyone can
/// tell whether a recorded owner still lives (``isAlive(_:)``: one open and one non-blocking
/// `flock`) and be woken when it dies (``watch(_:callback:)``, through ``FileEvents``), without
/// pids (which are reused, and which iOS's sandbox hides), `/proc`, robust mutexes or OFD locks.
///
/// Suspension: a suspended process may hold no lock (iOS's 0xDEAD10CC), so the container's
/// suspension first waits for this process's critical sections (``enter()``/``leave()``) to end,
/// then releases the token; from then on this process's records read as dead, and others may
/// repair or reclaim what they name. After the suspension the process takes a *new* token on
/// first use: whatever it owned before must be claimed again, which is exactly what a process
/// that may have been presumed dead has to do.
package final class OwnerTokens: Sendable {
    static let directoryName = "owners"

    /// A descriptor of `.baton` of its own, and the directory's path.
    private let directoryDescriptor: FileDescriptor
    /// ``directoryDescriptor``'s number, borrowed for a system call while this object lives.
    private var directory: Int32 { directoryDescriptor.rawValue }
    private let batonPath: String
    private let fileMode: mode_t
    private struct State: ~Copyable {
        var token: UInt64?
        /// The token's file, locked exclusively while the token is this process's.
        var file: FileDescriptor?
        var suspended = false
    }
    private let state = Mutex(State())
    /// The hot path of ``enter()``/``leave()`` (every defaults write, every channel operation):
    /// atomics only. `cached` is the current token (0: none); `inside` counts this process's
    /// critical sections; `suspending` is set before a suspension looks at `inside`, and a
    /// section checks it after counting itself, so one of the two always sees the other.
    private let cached = Atomic<UInt64>(0)
    private let inside = Atomic<Int>(0)
    private let suspending = Atomic<Bool>(false)
    /// Moves when the last critical section ends (a suspension waits on it).
    private let sectionsEnded = EventCounter()
    /// Descriptors of other processes' token files found alive, kept open so that the next
    /// ``isAlive(_:)`` of the same token is one non-blocking `flock` instead of an open, an
    /// `fstat`, a `flock` and a close (a rendezvous hand-off asks about its peer each time). The
    /// probe runs under this lock: a descriptor is never closed while another thread uses it.
    private let peers = Mutex<[UInt64: Int32]>([:])
    /// The most descriptors kept (one is closed to make room for another).
    static let peerCacheLimit = 32

    /// - Parameters:
    ///   - directory: A descriptor of the container's `.baton` directory (duplicated here).
    ///   - batonPath: Its path.
    ///   - fileMode: The mode of the files created.
    init(directory: Int32, batonPath: String, fileMode: mode_t) throws {
        self.directoryDescriptor = FileDescriptor(adopting: try Sys.retrying("dup") { baton_fcntl_int(directory, F_DUPFD_CLOEXEC, 0) }.get("keeping \(batonPath) open"))
        self.batonPath = batonPath
        self.fileMode = fileMode
    }

    deinit {
        // Unlocked before it closes (the directory's descriptor closes itself after this).
        state.withLock { $0.file.take() }?.unlockAndClose()
        for fd in peers.withLock({ Array($0.values) }) { FileDescriptor(adopting: fd).close() }
    }

    // MARK: This process's token

    /// This process's token, taken on first use. - Throws: `suspended` while suspended.
    package func current() throws -> UInt64 {
        let (token, created) = try state.withLock { state in try take(&state) }
        if created { sweep() }
        return token
    }

    /// Begins a critical section that records this process's token in shared state; the
    /// container's suspension waits until it ends (``leave()``). Returns the token.
    /// - Throws: `suspended` while suspended.
    package func enter() throws -> UInt64 {
        inside.wrappingAdd(1, ordering: .sequentiallyConsistent)
        if !suspending.load(ordering: .sequentiallyConsistent) {
            let token = cached.load(ordering: .acquiring)
            if token != 0 { return token }
        }
        do {
            return try current()
        } catch {
            leave()
            throw error
        }
    }

    /// Ends a critical section begun with ``enter()``.
    package func leave() {
        let remaining = inside.wrappingSubtract(1, ordering: .sequentiallyConsistent).newValue
        if remaining == 0 && suspending.load(ordering: .sequentiallyConsistent) { sectionsEnded.notify() }
    }

    /// The current token, taken now if needed (`created`).
    private func take(_ state: inout State) throws -> (token: UInt64, created: Bool) {
        // Suspended first: a suspension in progress is about to release the token.
        if state.suspended {
            throw BatonError(.suspended, "cannot take ownership of shared state while the process is suspended; call resume() first")
        }
        if let token = state.token { return (token, false) }
        switch Sys.mkdirat(directory, Self.directoryName, 0o700) {
        case .success: break
        case .failure(let error) where error.errno == EEXIST: break
        case .failure(let error): throw BatonError.system(error, "creating \(batonPath)/\(Self.directoryName)")
        }
        while true {
            var token = UInt64.random(in: 1...UInt64(Int64.max))
            if token == 0 { token = 1 }
            // Created under a temporary name, locked, then renamed into place: a sweep never
            // sees the file unlocked.
            let temporary = Self.directoryName + "/.new-" + Self.name(token)
            let file = FileDescriptor(adopting: try Sys.openat(directory, temporary, O_RDWR | O_CREAT | O_EXCL, fileMode).get("creating the owner token \(temporary)"))
            let installed: Bool
            do {
                installed = try install(file.rawValue, token: token, temporary: temporary)
            } catch {
                _ = Sys.unlinkat(directory, temporary)
                file.unlockAndClose()
                throw error
            }
            guard installed else {
                _ = Sys.unlinkat(directory, temporary)
                file.unlockAndClose()
                continue // taken already (one in 2^63): draw again
            }
            state.token = token
            state.file = consume file
            cached.store(token, ordering: .releasing)
            return (token, true)
        }
    }

    /// Locks the new token file `fd` (at `temporary`) and renames it into place; `false` when
    /// the token is taken already.
    private func install(_ fd: Int32, token: UInt64, temporary: String) throws -> Bool {
        guard try Sys.tryFlock(fd, LOCK_EX).get("locking the owner token \(temporary)") else {
            throw BatonError(.lockingNotSupported, "a new owner token file could not be locked")
        }
        if case .success = Sys.fstatat(directory, Self.path(token)) { return false }
        try Sys.renameat(directory, temporary, directory, Self.path(token)).get("installing the owner token \(Self.path(token))")
        return true
    }

    static func name(_ token: UInt64) -> String {
        let hex = String(token, radix: 16)
        return String(repeating: "0", count: max(0, 16 - hex.count)) + hex
    }

    static func path(_ token: UInt64) -> String { directoryName + "/" + name(token) }

    // MARK: Other processes' tokens

    /// Whether the process that holds `token` is alive and not suspended. This process's own
    /// current token is alive. A token whose holder is gone has its file removed.
    package func isAlive(_ token: UInt64) -> Bool {
        if token == 0 { return false }
        if cached.load(ordering: .acquiring) == token { return true }
        let path = Self.path(token)
        let known = peers.withLock { peers -> Bool? in
            guard let fd = peers[token] else { return nil }
            switch Sys.tryFlock(fd, LOCK_SH) {
            case .success(false), .failure:
                return true
            case .success(true):
                // Released since: dead or suspended for good (a resumed process takes a new token).
                peers[token] = nil
                _ = Sys.unlinkat(directory, path)
                FileDescriptor(adopting: fd).unlockAndClose()
                return false
            }
        }
        if let known { return known }
        let file: FileDescriptor
        // Non-blocking and without following links: a FIFO planted in the token's place must not
        // block the open, and a link is not a token.
        switch Sys.openat(directory, path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW) {
        case .success(let value): file = FileDescriptor(adopting: value)
        case .failure(let error) where error.errno == ELOOP:
            _ = Sys.unlinkat(directory, path)
            return false
        case .failure(let error): return error.errno != ENOENT && error.errno != ENOTDIR
        }
        guard case .success(let info) = Sys.fstat(file.rawValue), info.st_mode & S_IFMT == S_IFREG else {
            // Not a file a process could hold (a FIFO, a directory...): nobody's token.
            file.close()
            _ = Sys.unlinkat(directory, path)
            return false
        }
        switch Sys.tryFlock(file.rawValue, LOCK_SH) {
        case .success(false):
            keep(file, for: token)
            return true
        case .success(true):
            // Nobody holds it: its process died or was suspended. Remove the file (its id is
            // never drawn again while it exists, and a resumed process takes a new one).
            _ = Sys.unlinkat(directory, path)
            file.unlockAndClose()
            return false
        case .failure:
            return true
        }
    }

    /// Keeps the descriptor of a live peer's token file for the next ``isAlive(_:)``.
    private func keep(_ file: consuming FileDescriptor, for token: UInt64) {
        let fd = file.release()
        let surplus = peers.withLock { peers -> [Int32] in
            var surplus: [Int32] = []
            if let old = peers[token] { surplus.append(old) }
            if peers[token] == nil, peers.count >= Self.peerCacheLimit, let victim = peers.first {
                peers[victim.key] = nil
                surplus.append(victim.value)
            }
            peers[token] = fd
            return surplus
        }
        for old in surplus { FileDescriptor(adopting: old).close() }
    }

    /// Calls `callback` (on the file-event thread) when the holder of `token` may have released
    /// it: it died, was suspended, or its file was removed. Returns the subscription to keep
    /// while waiting, or `nil` when the token is already dead (check ``isAlive(_:)`` *after*
    /// subscribing: a death in between is then reported one way or the other).
    package func watch(_ token: UInt64, callback: @escaping @Sendable () -> Void) -> FileEvents.Subscription? {
        let path = batonPath + "/" + Self.path(token)
        let following = Atomic<Bool>(false)
        return try? FileEvents.shared.subscribe(path: path, interest: .writerGone) {
            callback()
            // Only the token's process opens the file for writing, and it closes it only when it
            // dies or suspends: the release follows at once. Linux posts the close event just
            // before it drops the lock, so the first look may still find it held; one thread then
            // waits for the release itself (a blocking flock, no timer) and calls back again.
            guard !following.exchange(true, ordering: .acquiringAndReleasing) else { return }
            KernelThread.spawn(name: "baton-owner-gone") {
                defer { following.store(false, ordering: .releasing) }
                guard case .success(let fd) = Sys.open(path, O_RDONLY | O_NOFOLLOW) else { return callback() }
                let file = FileDescriptor(adopting: fd)
                _ = Sys.flock(file.rawValue, LOCK_SH)
                file.unlockAndClose()
                callback()
            }
        }
    }

    /// Subscribes to the release of any token of the container (a process died or suspended):
    /// for waits that depend on several processes at once.
    package func watchAll() throws -> FileEvents.Subscription {
        switch Sys.mkdirat(directory, Self.directoryName, 0o700) {
        case .success: break
        case .failure(let error) where error.errno == EEXIST: break
        case .failure(let error): throw BatonError.system(error, "creating \(batonPath)/\(Self.directoryName)")
        }
        return try FileEvents.shared.subscribe(path: batonPath + "/" + Self.directoryName, interest: .writerGoneInDirectory)
    }

    /// Removes the files of dead tokens (run when a process takes its first token).
    package func sweep() {
        for name in Sys.directoryEntries(directory, Self.directoryName) where !name.hasPrefix(".") {
            guard let token = UInt64(name, radix: 16) else { continue }
            _ = isAlive(token)
        }
    }

    // MARK: Suspension

    /// Waits for this process's critical sections to end, then releases the token.
    func suspend() async {
        suspending.store(true, ordering: .sequentiallyConsistent)
        state.withLock { $0.suspended = true }
        while true {
            let seen = sectionsEnded.snapshot()
            if inside.load(ordering: .sequentiallyConsistent) == 0 {
                state.withLock { state in
                    if let file = state.file.take() {
                        file.unlockAndClose()
                        if let token = state.token { _ = Sys.unlinkat(directory, Self.path(token)) }
                    }
                    state.token = nil
                    cached.store(0, ordering: .releasing)
                }
                return
            }
            // A critical section lasts microseconds and never waits for this task.
            try? await sectionsEnded.wait(after: seen, deadline: .never)
        }
    }

    func resume() {
        state.withLock { $0.suspended = false }
        suspending.store(false, ordering: .sequentiallyConsistent)
    }
}


/// Forwards the container's suspension to its owner tokens (held weakly: the container keeps
/// both).
final class OwnerTokenSuspension: SuspensionParticipant {
    private weak let tokens: OwnerTokens?
    init(_ tokens: OwnerTokens) { self.tokens = tokens }
    func suspend() async { await tokens?.suspend() }
    func resume() async throws { tokens?.resume() }
}
