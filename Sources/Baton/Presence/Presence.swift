import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization

/// A live process of the container, as ``Presence`` lists it.
public struct PresenceRecord: Codable, Sendable, Hashable {
    /// A random id, unique per registration.
    public var id: String
    /// What the process is: `app`, `extension`, or any string.
    public var kind: String
    /// Its process id.
    public var pid: Int32
    /// When it registered.
    public var since: Date

    public init(id: String, kind: String, pid: Int32, since: Date) {
        self.id = id
        self.kind = kind
        self.pid = pid
        self.since = since
    }

    /// The kind of a live process whose presence file cannot be read (its pid is then 0).
    public static let unknownKind = "unknown"
}

/// What ``Presence/scan()`` found: the live processes, and the entries it skipped.
public struct PresenceScan: Sendable, Hashable {
    /// The live processes, oldest first.
    public var records: [PresenceRecord] = []
    /// Entries of the presence directory that are not presence files.
    public var skipped: [Skipped] = []

    /// An entry that is not a presence file, and why.
    public struct Skipped: Sendable, Hashable {
        /// Its name in `.baton/presence`.
        public var name: String
        /// What is wrong with it, such as "a symbolic link".
        public var reason: String
    }
}

/// Who is alive in the container.
///
/// A running process holds a `flock` on its own presence file (`.baton/presence/<id>.lock`).
/// The kernel drops that lock the instant the process dies, so a crash is seen at once, not
/// after a heartbeat goes stale. Observers are woken by inotify close events, without polling.
///
/// ```swift
/// let me = try container.presence.register(kind: "extension")
/// let live = try container.presence.list()          // [PresenceRecord]
/// for await snapshot in container.presence.changes() { ... }
/// ```
public final class Presence: Sendable {
    static let directoryName = "presence"
    let container: SharedContainer

    init(container: SharedContainer) { self.container = container }

    /// Registers this process under `kind` and holds its presence lock until the registration
    /// is released (or deinitialized), or the container is suspended.
    /// - Throws: `invalidName` for an empty kind or one over 255 bytes; file-system errors.
    public func register(kind: String) throws -> PresenceRegistration {
        guard !kind.isEmpty, kind.utf8.count <= 255 else {
            throw BatonError(.invalidName, "a presence kind must be 1 to 255 bytes of UTF-8")
        }
        try container.suspension.checkActive("register presence")
        let id = String(UInt64.random(in: 0...UInt64.max), radix: 36)
        let record = PresenceRecord(id: id, kind: kind, pid: baton_process_id(), since: Date())
        let registration = PresenceRegistration(presence: self, record: record)
        try registration.acquire()
        return registration
    }

    /// The processes alive now. Stale files of dead processes are removed on the way; entries
    /// that are not presence files are skipped (see ``scan()`` to learn about them).
    public func list() throws -> [PresenceRecord] {
        try scan().records
    }

    /// The processes alive now, and the entries of the presence directory that were skipped
    /// because they are not presence files (a symbolic link, a directory, a FIFO...).
    ///
    /// The lock, not the content, says who is alive: a locked file whose content cannot be read
    /// is listed with kind ``PresenceRecord/unknownKind``, pid 0 and the 1970 epoch as `since`.
    public func scan() throws -> PresenceScan {
        try container.makeDirectory(Self.directoryName)
        let directory = try container.openDescriptor(Self.directoryName, flags: O_RDONLY | O_DIRECTORY)
        guard let stream = fdopendir(directory.rawValue) else {
            throw BatonError.system(SystemCallError(call: "fdopendir", errno: errno), "listing presence")
        }
        _ = directory.release() // the stream owns it now: closedir closes it
        defer { closedir(stream) }
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name.hasSuffix(".lock") { names.append(name) }
        }
        var result = PresenceScan()
        for name in names {
            switch try entry(fileName: name) {
            case .live(let record): result.records.append(record)
            case .gone: break
            case .skipped(let reason): result.skipped.append(PresenceScan.Skipped(name: name, reason: reason))
            }
        }
        result.records.sort { ($0.since, $0.pid) < ($1.since, $1.pid) }
        return result
    }

    /// Whether a process with this pid is registered and alive.
    public func isAlive(pid: Int32) throws -> Bool {
        try list().contains { $0.pid == pid }
    }

    /// Whether the registration with this id is alive.
    public func isAlive(id: String) throws -> Bool {
        guard (try? SharedContainer.validateName(id, what: "a presence id")) != nil else { return false }
        if case .live = try entry(fileName: id + ".lock") { return true }
        return false
    }

    private enum Entry {
        case live(PresenceRecord)
        case gone
        case skipped(String)
    }

    /// Reads one presence file: the record if its holder is alive, `.gone` (and the file removed)
    /// if not, `.skipped` for an entry that is not a presence file.
    private func entry(fileName: String) throws -> Entry {
        let path = Self.directoryName + "/" + fileName
        let fd: Int32
        // Non-blocking: a FIFO in the directory must not block the listing.
        switch Sys.openat(container.directory, path, O_RDONLY | O_NONBLOCK) {
        case .success(let value): fd = value
        case .failure(let error) where error.errno == ENOENT: return .gone
        case .failure(let error) where error.errno == ELOOP: return .skipped("a symbolic link (\(error))")
        case .failure(let error) where error.errno == EACCES || error.errno == EPERM || error.errno == ENXIO:
            return .skipped("cannot be opened (\(error))")
        case .failure(let error): throw BatonError.system(error, "opening \(path)")
        }
        defer { Sys.close(fd) }
        let info = try Sys.fstat(fd).get("checking \(path)")
        guard info.st_mode & S_IFMT == S_IFREG else { return .skipped("not a regular file") }
        if try Sys.tryFlock(fd, LOCK_SH).get("checking \(path)") {
            // Nobody holds it: the process is gone (or suspended). Remove the stale file
            // while holding its lock, unless a new registration renamed itself over it.
            if case .success(let current) = Sys.fstatat(container.directory, path), info.st_ino == current.st_ino {
                _ = Sys.unlinkat(container.directory, path)
            }
            return .gone
        }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = try buffer.withUnsafeMutableBytes { try Sys.preadAll(fd, $0, at: 0).get("reading \(path)") }
        if var record = try? JSONDecoder().decode(PresenceRecord.self, from: Data(buffer[0..<count])) {
            // The id is the locked file's name (what ``isAlive(id:)`` checks), whatever the
            // content says.
            record.id = String(fileName.dropLast(".lock".count))
            return .live(record)
        }
        // Locked, so alive, but its content is unreadable: list what can be known.
        return .live(PresenceRecord(
            id: String(fileName.dropLast(".lock".count)), kind: PresenceRecord.unknownKind, pid: 0,
            since: Date(timeIntervalSince1970: 0)))
    }

    /// Snapshots of the live processes: one now, then one each time the set changes.
    /// Driven by inotify events on the presence directory; no polling.
    public func changes() -> PresenceChanges { PresenceChanges(presence: self) }
}

/// Snapshots of the live processes of a container, as an `AsyncSequence`: the first element is
/// the current set, each next one a changed set. Iterate from one task; cancel the task to stop.
public struct PresenceChanges: AsyncSequence, Sendable {
    public typealias Element = [PresenceRecord]
    let presence: Presence

    public func makeAsyncIterator() -> Iterator { Iterator(presence: presence) }

    /// Iterates snapshots.
    public struct Iterator: AsyncIteratorProtocol {
        let presence: Presence
        var subscription: FileEvents.Subscription?
        var last: [PresenceRecord]?

        init(presence: Presence) { self.presence = presence }

        /// The next changed snapshot; `nil` when the task is cancelled.
        /// - Throws: File-system errors while listing.
        public mutating func next() async throws -> [PresenceRecord]? {
            if subscription == nil {
                try presence.container.makeDirectory(Presence.directoryName)
                subscription = try FileEvents.shared.subscribe(
                    path: presence.container.absolutePath(Presence.directoryName), interest: .directoryChanged)
            }
            guard let events = subscription?.events else { return nil }
            while !Task.isCancelled {
                let seen = events.snapshot()
                // A close is reported just before the kernel drops a dying process's lock:
                // look again shortly after each event.
                for delay in [Duration.zero, .milliseconds(1), .milliseconds(5), .milliseconds(25)] {
                    if delay > .zero {
                        do { try await Task.sleep(for: delay) } catch { return nil }
                    }
                    let now = try presence.list()
                    if now != last {
                        last = now
                        return now
                    }
                    if events.snapshot() != seen { break }
                }
                do { try await events.wait(after: seen, deadline: .never) } catch { return nil }
            }
            return nil
        }
    }
}

/// This process's presence. Holds the presence lock until ``release()``, deinit, or suspension
/// (``SharedContainer/suspend()`` releases it, ``SharedContainer/resume()`` takes it back).
public final class PresenceRegistration: SuspensionParticipant {
    /// What others see.
    public let record: PresenceRecord
    private let presence: Presence
    private let state = Mutex<(fd: Int32, released: Bool, token: SuspensionController.RegistrationToken?)>((-1, false, nil))

    init(presence: Presence, record: PresenceRecord) {
        self.presence = presence
        self.record = record
    }

    /// Whether the presence lock is held now.
    public var isHeld: Bool { state.withLock { $0.fd >= 0 } }

    /// Creates the presence file under a temporary name, locks it, writes the record, then
    /// renames it into place, so no lister ever sees it unlocked.
    func acquire() throws {
        let container = presence.container
        try container.makeDirectory(Presence.directoryName)
        let final = Presence.directoryName + "/" + record.id + ".lock"
        let temporary = Presence.directoryName + "/" + record.id + ".new"
        _ = Sys.unlinkat(container.directory, temporary)
        let file = try container.openDescriptor(temporary, flags: O_RDWR | O_CREAT | O_EXCL)
        let fd = file.rawValue
        do {
            try Sys.flock(fd, LOCK_EX).get("locking \(temporary)")
            let encoder = JSONEncoder()
            encoder.dateEncodingStrategy = .deferredToDate
            let bytes = Array(try encoder.encode(record))
            try bytes.withUnsafeBytes { try Sys.pwriteAll(fd, $0, at: 0).get("writing \(temporary)") }
            try Sys.renameat(container.directory, temporary, container.directory, final).get("publishing \(final)")
        } catch {
            file.close()
            _ = Sys.unlinkat(container.directory, temporary)
            throw error
        }
        // `state` owns the number from here (unlocked and closed by `release()`).
        let owned = file.release()
        let token = state.withLock { state -> SuspensionController.RegistrationToken? in
            state.fd = owned
            return state.token
        }
        if token == nil {
            let token = container.suspension.register(SuspensionForwarder(self))
            state.withLock { $0.token = token }
        }
    }

    /// What the container's suspension controller holds: the registration weakly, so that one
    /// dropped without ``release()`` is deinitialized (and releases its lock) rather than kept
    /// alive by its container, and keeping its container alive in turn.
    private final class SuspensionForwarder: SuspensionParticipant {
        weak let registration: PresenceRegistration?
        init(_ registration: PresenceRegistration) { self.registration = registration }
        func suspend() async { await registration?.suspend() }
        func resume() async throws { try await registration?.resume() }
    }

    /// Unregisters: removes the presence file and releases the lock.
    public func release() {
        let (fd, token) = state.withLock { state -> (Int32, SuspensionController.RegistrationToken?) in
            defer { state = (-1, true, nil) }
            return (state.fd, state.token)
        }
        if let token { presence.container.suspension.unregister(token) }
        if fd >= 0 {
            _ = Sys.unlinkat(presence.container.directory, Presence.directoryName + "/" + record.id + ".lock")
            Sys.unlockAndClose(fd)
        }
    }

    deinit { release() }

    /// Releases the presence lock; the process no longer appears alive.
    public func suspend() async {
        let fd = state.withLock { state -> Int32 in
            defer { state.fd = -1 }
            return state.fd
        }
        if fd >= 0 { Sys.unlockAndClose(fd) }
    }

    /// Takes the presence lock back.
    public func resume() async throws {
        let released = state.withLock { $0.released || $0.fd >= 0 }
        if !released { try acquire() }
    }
}
