import CBatonShims
import Synchronization

/// One of this process's lock files in a role's directory: `holder-<pid>-<id>.lock` (held while
/// the process holds the role) or `waiter-<pid>-<id>.lock` (held while it waits, with its
/// priority, pid and kind inside).
///
/// The file is created (and mapped) when the role is opened and kept open: taking and dropping
/// the role only locks and unlocks it, so the hot path creates and deletes no files (creating a
/// file waits for the file system's journal). The kernel drops the lock the instant the process
/// dies, and closing the descriptor then wakes watchers through inotify; a suspension closes the
/// descriptor too. Other processes remove the file only once its pid is certainly gone
/// (``ProcessExistence``; a reused pid or a sandbox that hides the process only delays that);
/// the owner removes it on deinit. A file found unlinked anyway is created again
/// before it is locked.
final class RoleLockFile: Sendable {
    let directory: RoleDirectory
    let prefix: String
    let id: UInt64

    private struct State: @unchecked Sendable {
        // @unchecked: the mapping is only used under the `state` mutex.
        /// The file, mapped so that writing its content is a copy: a `pwrite` would update the
        /// file's times and wait for the file system's journal inside a transition. It owns the
        /// descriptor (closed once, when the mapping goes: ``close()``, or a file found
        /// unlinked); the `flock`s borrow its number while it is open.
        var file: MappedFile?
        var locked = false
    }

    private let state = Mutex(State())
    /// The size of a file's content, padded with newlines.
    static let contentSize = 256

    init(directory: RoleDirectory, prefix: String) {
        self.directory = directory
        self.prefix = prefix
        self.id = UInt64.random(in: 1...UInt64.max)
    }

    /// Closes and removes the file: its id is unique to this object, so no one else uses it.
    deinit {
        close()
        directory.removeFile(relativePath)
    }

    var relativePath: String { Self.relativePath(directory: directory, prefix: prefix, pid: baton_process_id(), id: id) }

    static func relativePath(directory: RoleDirectory, prefix: String, pid: Int32, id: UInt64) -> String {
        directory.path + "/\(prefix)-\(pid)-\(String(id, radix: 16)).lock"
    }

    /// Parses `<prefix>-<pid>-<hex id>.lock`.
    static func parse(_ fileName: String, prefix: String) -> (pid: Int32, id: UInt64)? {
        guard fileName.hasPrefix(prefix + "-"), fileName.hasSuffix(".lock") else { return nil }
        let middle = fileName.dropFirst(prefix.count + 1).dropLast(".lock".count).split(separator: "-")
        guard middle.count == 2, let pid = Int32(middle[0]), let id = UInt64(middle[1], radix: 16) else { return nil }
        return (pid, id)
    }

    var isLocked: Bool { state.withLock { $0.locked } }

    /// Creates and maps the file now (unlocked), so that taking the role later costs only a
    /// `flock`: creating a file waits for the file system's journal.
    func prepare() throws {
        try state.withLock { state in
            if state.file == nil {
                state.file = try MappedFile(directory.container, relativePath: relativePath, minimumSize: Self.contentSize)
            }
        }
    }

    /// Locks the file exclusively (creating it when missing), after `writeContent` wrote its
    /// content in place: it gets the first ``contentSize`` bytes of the mapping and must fill
    /// them all. Call inside a transition of the role. Returns `false` if another process holds
    /// it.
    func lock(writingContent writeContent: ((UnsafeMutableRawBufferPointer) -> Void)? = nil) throws -> Bool {
        try state.withLock { state in
            if let file = state.file, case .success(let info) = Sys.fstat(file.fd), info.st_nlink == 0 {
                state = State()
            }
            // The path is built only when needed (a `String` built on every lock cost 0.3 µs of
            // an uncontended acquire and release, 2.4% of it in a profile).
            let file = try state.file ?? MappedFile(directory.container, relativePath: relativePath, minimumSize: Self.contentSize)
            state.file = file
            writeContent?(UnsafeMutableRawBufferPointer(start: file.pointer, count: Self.contentSize))
            if state.locked { return true }
            state.locked = try Sys.tryFlock(file.fd, LOCK_EX).get("locking \(relativePath)")
            return state.locked
        }
    }

    /// Drops the lock, keeping the file open for next time (no close event: wake others with
    /// the role's signal).
    func unlock() {
        state.withLock { state in
            guard state.locked, let file = state.file else { return }
            _ = Sys.flock(file.fd, LOCK_UN)
            state.locked = false
        }
    }

    /// Closes the file (dropping the lock): on suspension, and when the role goes away.
    func close() {
        let file = state.withLock { state -> MappedFile? in
            defer { state = State() }
            return state.file
        }
        _ = file // unmapped and closed when released here
    }
}
