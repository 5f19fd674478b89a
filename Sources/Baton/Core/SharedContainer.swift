import Logging
import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization

/// The directory that several processes share: an App Group container on iOS, a data directory
/// on Linux. Everything Baton keeps lives in its `.baton` subdirectory.
///
/// ```swift
/// let container = try SharedContainer(at: groupURL)
/// try container.signals.post("messages")
/// ```
///
/// Opening validates the directory once: it must exist, be a directory owned by this user,
/// writable by it and by no other user (no group or others write permission), and sit on a file
/// system where `flock(2)` works; ``Options/trustsOtherUsers`` accepts another owner or write
/// permission for others. Baton's own directory is created with mode 0700 and its files with
/// 0600 (see ``Options``), every file is opened with `O_CLOEXEC` and `O_NOFOLLOW`, and anything
/// but a regular file where Baton expects one (a FIFO, a directory) is refused at once. On Apple platforms the files Baton creates get the data-protection class
/// ``Options/fileProtection`` (by default one a notification service extension can open while
/// the device is locked).
public final class SharedContainer: Sendable {
    /// How Baton creates its files.
    public struct Options: Sendable, Hashable {
        /// Permission bits of the directories Baton creates.
        public var directoryMode: UInt32 = 0o700
        /// Permission bits of the files Baton creates.
        public var fileMode: UInt32 = 0o600
        /// The data-protection class of the files Baton creates (Apple platforms): by default
        /// readable by a notification service extension while the device is locked.
        public var fileProtection: FileProtection = .completeUntilFirstUserAuthentication

        /// Accept a container (and `.baton`) that another user owns or that group or others may
        /// write. Off by default: such a user could replace Baton's files and forge what this
        /// process reads. Turn it on only for a directory deliberately shared between users.
        public var trustsOtherUsers = false

        public init(
            directoryMode: UInt32 = 0o700,
            fileMode: UInt32 = 0o600,
            fileProtection: FileProtection = .completeUntilFirstUserAuthentication,
            trustsOtherUsers: Bool = false
        ) {
            self.directoryMode = directoryMode
            self.fileMode = fileMode
            self.fileProtection = fileProtection
            self.trustsOtherUsers = trustsOtherUsers
        }
    }

    /// The `.baton` directory and the file operations on it. The parts the container keeps
    /// (``signals``) hold this, never the container itself: a container object is freed, with
    /// its parts' threads and mappings, once nobody else holds it.
    package let files: ContainerFiles

    /// The container directory.
    public var path: String { files.path }
    /// `path` + `/.baton`.
    public var batonPath: String { files.batonPath }
    /// The options the container was opened with.
    public var options: Options { files.options }
    /// Where Baton reports what it repaired or decided on its own (recoveries, take-overs,
    /// overtaken holders, rebuilt tables, skipped dead tickets, refused stale epochs); `nil`
    /// (the default) logs nothing. Each message has the metadata `baton.event`.
    public var logger: Logger? { files.logger }
    /// ``logger`` with the container's name, for the engines.
    package var diagnostics: Diagnostics { files.diagnostics }

    /// A descriptor of `.baton`, borrowed for `*at` calls while the container lives.
    package var directory: Int32 { files.directory }

    /// The process-wide suspension state of this container: see ``suspend()``.
    public let suspension: SuspensionController
    /// This process's owner token in the container, and liveness checks of others'.
    package let owners: OwnerTokens

    /// Parts made on first use and kept for the container's life. None of them refers back to
    /// the container (see ``files``).
    private let lazyParts = Mutex<LazyParts>(LazyParts())
    private struct LazyParts {
        var signals: Signals?
        var channelWaiters: ChannelWaiterTable?
    }

    /// The longest relative path Baton itself creates under `.baton` (e.g. `defaults/<suite>.log`
    /// with a 255-byte suite name). A container path that leaves less room than this is refused.
    static let reservedRelativeLength = 300

    /// Opens (and on first use prepares) a shared container.
    ///
    /// - Parameters:
    ///   - url: A file URL of an existing directory.
    ///   - options: Permission bits for the files Baton creates.
    ///   - logger: Where Baton reports its repairs and decisions (see ``logger``); nil logs nothing.
    /// - Throws: ``BatonError`` with code `notFound`, `notADirectory`, `notWritable`,
    ///   `ownedByAnotherUser`, `writableByOthers`, `pathTooLong`, `symbolicLink` or
    ///   `lockingNotSupported`.
    public convenience init(at url: URL, options: Options = Options(), logger: Logger? = nil) throws {
        guard url.isFileURL else {
            throw BatonError(.invalidArgument, "the container must be a file URL, got \(url.absoluteString)")
        }
        try self.init(path: url.path, options: options, logger: logger)
    }

    /// Opens (and on first use prepares) a shared container at a file-system path.
    ///
    /// - Parameters:
    ///   - path: An existing directory.
    ///   - options: Permission bits for the files Baton creates.
    ///   - logger: Where Baton reports its repairs and decisions (see ``logger``); nil logs nothing.
    /// - Throws: See ``init(at:options:logger:)``.
    public init(path: String, options: Options = Options(), logger: Logger? = nil) throws {
        var path = path
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        guard !path.isEmpty else {
            throw BatonError(.invalidArgument, "the container path is empty; pass the shared directory's path")
        }
        if path.utf8.count + Self.reservedRelativeLength >= Int(PATH_MAX) {
            throw BatonError(.pathTooLong, "the container path is \(path.utf8.count) bytes; Baton needs it under \(Int(PATH_MAX) - Self.reservedRelativeLength) bytes to fit its own files. Use a shorter path.")
        }
        let info: stat
        switch Sys.fstatat(AT_FDCWD, path, followLinks: true) {
        case .success(let value): info = value
        case .failure(let error) where error.errno == ENOENT:
            throw BatonError(.notFound, "the container directory \(path) does not exist; create it first (on iOS, use the App Group container URL)", cause: error)
        case .failure(let error) where error.errno == ENAMETOOLONG:
            throw BatonError(.pathTooLong, "the container path \(path) is too long for this system", cause: error)
        case .failure(let error) where error.errno == ENOTDIR:
            throw BatonError(.notADirectory, "a component of \(path) is not a directory", cause: error)
        case .failure(let error):
            throw BatonError.system(error, "checking the container directory \(path)")
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw BatonError(.notADirectory, "\(path) is not a directory; pass the shared directory itself")
        }
        try Self.checkOwnership(info, of: path, options: options)
        guard access(path, W_OK | X_OK) == 0 else {
            throw BatonError(.notWritable, "\(path) is not writable by this process; fix its permissions", cause: SystemCallError(call: "access", errno: errno))
        }

        // `.baton` itself: create it if missing, refuse a link.
        let container = FileDescriptor(adopting: try Sys.open(path, O_RDONLY | O_DIRECTORY).get("opening the container \(path)"))
        let containerFD = container.rawValue
        switch Sys.mkdirat(containerFD, ".baton", mode_t(options.directoryMode)) {
        case .success, .failure(SystemCallError(call: "mkdirat", errno: EEXIST)): break
        case .failure(let error): throw BatonError.system(error, "creating \(path)/.baton")
        }
        let directory: FileDescriptor
        switch Sys.openat(containerFD, ".baton", O_RDONLY | O_DIRECTORY) {
        case .success(let fd): directory = FileDescriptor(adopting: fd)
        case .failure(let error) where error.errno == ELOOP || error.errno == ENOTDIR:
            throw BatonError(.symbolicLink, "\(path)/.baton is a symbolic link or not a directory; remove it so Baton can create its own", cause: error)
        case .failure(let error): throw BatonError.system(error, "opening \(path)/.baton")
        }
        container.close()
        // From here on a throw closes `directory` (a local, then a stored property).
        try Self.checkOwnership(try Sys.fstat(directory.rawValue).get("checking \(path)/.baton"), of: path + "/.baton", options: options)
        let owners = try OwnerTokens(directory: directory.rawValue, batonPath: path + "/.baton", fileMode: mode_t(options.fileMode))

        self.files = ContainerFiles(path: path, options: options, logger: logger, directory: directory)
        self.suspension = SuspensionController()
        self.owners = owners
        // Registered first, so suspended last (after every part released what it owns) and
        // resumed first.
        _ = suspension.register(OwnerTokenSuspension(owners))

        // flock must work here (it does not on some network file systems).
        let probe = try openDescriptor("container.lock", flags: O_RDWR | O_CREAT)
        switch Sys.tryFlock(probe.rawValue, LOCK_SH) {
        case .success: break
        case .failure(let error):
            throw BatonError(.lockingNotSupported, "the file system of \(path) does not support flock(2) (\(error)); put the container on a local file system", cause: error)
        }
    }

    /// Refuses a directory that another user owns or that group or others may write, unless
    /// ``Options/trustsOtherUsers`` is set.
    static func checkOwnership(_ info: stat, of path: String, options: Options) throws {
        guard !options.trustsOtherUsers else { return }
        guard info.st_uid == geteuid() else {
            throw BatonError(.ownedByAnotherUser, "\(path) belongs to user \(info.st_uid), not to this process's user \(geteuid()); Baton refuses to share files with another user (SharedContainer.Options.trustsOtherUsers accepts it)")
        }
        guard info.st_mode & 0o022 == 0 else {
            throw BatonError(.writableByOthers, "\(path) may be written by other users (mode \(String(info.st_mode & 0o7777, radix: 8))), who could replace Baton's files; remove their write permission (chmod go-w) or set SharedContainer.Options.trustsOtherUsers")
        }
    }

    // MARK: - Parts

    /// Cross-process signals for this container.
    public var signals: Signals {
        get throws {
            try lazyParts.withLock { parts in
                if let signals = parts.signals { return signals }
                let signals = try Signals(container: self)
                parts.signals = signals
                return signals
            }
        }
    }

    /// The claim words of this container's rendezvous waiters, shared by its channels (made
    /// when the first channel opens). Its records carry this container's ``owners``, so that this
    /// container's suspension is what releases them.
    var channelWaiters: ChannelWaiterTable {
        get throws {
            try lazyParts.withLock { parts in
                if let table = parts.channelWaiters { return table }
                let table = try ChannelWaiterTable(files: files, owners: owners)
                parts.channelWaiters = table
                return table
            }
        }
    }

    /// Which processes are alive in this container. (It keeps no state of its own: each use
    /// gets a new one, which holds the container; the container does not hold it.)
    public var presence: Presence { Presence(container: self) }

    /// Releases every kernel lock Baton holds for this container in this process, before the
    /// process is suspended. Calls nest: each needs a matching ``resume()``.
    public func suspend() async { await suspension.suspend() }

    /// Takes back what ``suspend()`` released, when the last nested suspension ends.
    public func resume() async throws { try await suspension.resume() }

    // MARK: - Files

    /// Validates a name that becomes part of a file name: 1...255 bytes, no `/`, no NUL, not `.`
    /// or `..`.
    package static func validateName(_ name: String, what: String, maxBytes: Int = 255) throws {
        let bytes = name.utf8.count
        guard bytes >= 1, bytes <= maxBytes else {
            throw BatonError(.invalidName, "\(what) must be 1 to \(maxBytes) bytes of UTF-8; this one is \(bytes) bytes")
        }
        guard !name.utf8.contains(UInt8(ascii: "/")), !name.utf8.contains(0) else {
            throw BatonError(.invalidName, "\(what) \"\(name)\" contains a path separator or NUL; use a plain name")
        }
        guard name != ".", name != ".." else {
            throw BatonError(.invalidName, "\(what) may not be \".\" or \"..\"")
        }
    }

    /// See ``ContainerFiles/openDescriptor(_:flags:)``.
    package func openDescriptor(_ relativePath: String, flags: Int32) throws -> FileDescriptor {
        try files.openDescriptor(relativePath, flags: flags)
    }

    /// See ``ContainerFiles/openDescriptorIfPresent(_:flags:)``.
    package func openDescriptorIfPresent(_ relativePath: String, flags: Int32) throws -> FileDescriptor? {
        try files.openDescriptorIfPresent(relativePath, flags: flags)
    }

    /// ``openDescriptor(_:flags:)`` returning a bare number the caller must close.
    @available(*, deprecated, renamed: "openDescriptor(_:flags:)", message: "use openDescriptor, whose FileDescriptor closes itself once")
    package func openFile(_ relativePath: String, flags: Int32) throws -> Int32 {
        try openDescriptor(relativePath, flags: flags).release()
    }

    /// See ``ContainerFiles/makeDirectory(_:)``.
    package func makeDirectory(_ relativePath: String) throws { try files.makeDirectory(relativePath) }

    /// The absolute path of a file under `.baton`.
    package func absolutePath(_ relativePath: String) -> String { files.absolutePath(relativePath) }

    /// See ``ContainerFiles/replaceFile(_:with:)``.
    package func replaceFile(_ relativePath: String, with bytes: some Collection<UInt8>) throws {
        try files.replaceFile(relativePath, with: bytes)
    }

    /// See ``ContainerFiles/readFile(_:)``.
    package func readFile(_ relativePath: String) throws -> [UInt8]? { try files.readFile(relativePath) }
}
