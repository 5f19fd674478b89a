import Logging
import CBatonShims

/// A container's `.baton` directory as the engines use it: its descriptor, its paths, the
/// options files are created with, where repairs are reported, and the file operations on it.
///
/// ``SharedContainer`` owns one and forwards to it. A part that the container keeps for its
/// whole life (the signal table) holds this instead of the container, so that the container
/// does not keep itself alive through its own parts: dropping the last reference to a
/// container frees it, its parts, and their threads and mappings.
package final class ContainerFiles: Sendable {
    /// The container directory.
    package let path: String
    /// `path` + `/.baton`.
    package let batonPath: String
    /// The options the container was opened with.
    package let options: SharedContainer.Options
    /// Where Baton reports what it repaired or decided on its own (``SharedContainer/logger``).
    package let logger: Logger?
    /// ``logger`` with the container's name, for the engines.
    package var diagnostics: Diagnostics { Diagnostics(logger: logger, container: path) }

    /// A descriptor of `.baton`, used with the `*at` calls so no path is resolved twice.
    private let directoryDescriptor: FileDescriptor
    /// ``directoryDescriptor``'s number, borrowed for `*at` calls while this object lives.
    package var directory: Int32 { directoryDescriptor.rawValue }

    init(path: String, options: SharedContainer.Options, logger: Logger?, directory: consuming FileDescriptor) {
        self.path = path
        self.batonPath = path + "/.baton"
        self.options = options
        self.logger = logger
        self.directoryDescriptor = directory
    }

    /// Opens a file relative to `.baton` with `O_CLOEXEC | O_NOFOLLOW`, creating it with the
    /// container's file mode when `O_CREAT` is given. Unless `flags` has `O_DIRECTORY`, the file
    /// must be a regular file: it is opened with `O_NONBLOCK` (so a FIFO planted in its place
    /// cannot block the open), checked, and then made blocking again.
    /// - Returns: The open file, closed when the returned value goes away.
    /// - Throws: `notARegularFile` for a FIFO, directory, device or socket; `symbolicLink`.
    package func openDescriptor(_ relativePath: String, flags: Int32) throws -> FileDescriptor {
        let regular = flags & O_DIRECTORY == 0
        let fd: FileDescriptor
        switch Sys.openat(directory, relativePath, regular ? flags | O_NONBLOCK : flags, mode_t(options.fileMode)) {
        case .success(let value): fd = FileDescriptor(adopting: value)
        case .failure(let error) where error.errno == ELOOP:
            throw BatonError(.symbolicLink, "\(batonPath)/\(relativePath) is a symbolic link; Baton never follows links inside its directory. Remove it.", cause: error)
        case .failure(let error) where regular && (error.errno == EISDIR || error.errno == ENXIO):
            throw Self.notRegular(batonPath + "/" + relativePath, cause: error)
        case .failure(let error):
            throw BatonError.system(error, "opening \(batonPath)/\(relativePath)")
        }
        guard regular else { return fd }
        // A throw from here closes `fd`.
        let info = try Sys.fstat(fd.rawValue).get("checking \(batonPath)/\(relativePath)")
        guard info.st_mode & S_IFMT == S_IFREG else { throw Self.notRegular(batonPath + "/" + relativePath) }
        // Blocking again (no effect on a regular file's I/O; cleared so no caller is surprised).
        _ = fcntl(fd.rawValue, F_SETFL, fcntl(fd.rawValue, F_GETFL) & ~O_NONBLOCK)
        if flags & O_CREAT != 0, case let code = options.fileProtection.apply(to: fd.rawValue), code != 0 {
            throw BatonError.system(SystemCallError(call: "fcntl(F_SETPROTECTIONCLASS)", errno: code), "protecting \(batonPath)/\(relativePath)")
        }
        return fd
    }

    /// ``openDescriptor(_:flags:)``, or `nil` when the file does not exist.
    package func openDescriptorIfPresent(_ relativePath: String, flags: Int32) throws -> FileDescriptor? {
        do {
            return try openDescriptor(relativePath, flags: flags)
        } catch let error as BatonError where error.code == .notFound {
            return nil
        }
    }

    /// The error for a path that must be a regular file and is not.
    private static func notRegular(_ path: String, cause: SystemCallError? = nil) -> BatonError {
        BatonError(.notARegularFile, "\(path) is not a regular file (a FIFO, directory, device or socket is in its place); remove it so Baton can create its own", cause: cause)
    }

    /// Creates a subdirectory of `.baton` if missing (mode from ``SharedContainer/Options``).
    package func makeDirectory(_ relativePath: String) throws {
        switch Sys.mkdirat(directory, relativePath, mode_t(options.directoryMode)) {
        case .success: return
        case .failure(let error) where error.errno == EEXIST:
            let info = try Sys.fstatat(directory, relativePath).get("checking \(batonPath)/\(relativePath)")
            guard info.st_mode & S_IFMT == S_IFDIR else {
                throw BatonError(.notADirectory, "\(batonPath)/\(relativePath) exists but is not a directory; remove it")
            }
        case .failure(let error):
            throw BatonError.system(error, "creating \(batonPath)/\(relativePath)")
        }
    }

    /// The absolute path of a file under `.baton`.
    package func absolutePath(_ relativePath: String) -> String { batonPath + "/" + relativePath }

    /// Replaces a file under `.baton` atomically: write a temporary file, fsync, rename over the
    /// old one, fsync the directory. Readers see the old or the new content, never a mix.
    package func replaceFile(_ relativePath: String, with bytes: some Collection<UInt8>) throws {
        let temporary = relativePath + ".tmp-\(baton_process_id())-\(UInt32.random(in: 0...UInt32.max))"
        let file = try openDescriptor(temporary, flags: O_WRONLY | O_CREAT | O_EXCL)
        do {
            let data = Array(bytes)
            try data.withUnsafeBytes { try Sys.pwriteAll(file.rawValue, $0, at: 0).get("writing \(temporary)") }
            try DurableSync.sync(file.rawValue).get("syncing \(temporary)")
        } catch {
            file.close()
            _ = Sys.unlinkat(directory, temporary)
            throw error
        }
        file.close()
        do {
            try Sys.renameat(directory, temporary, directory, relativePath).get("renaming \(temporary) to \(relativePath)")
            _ = Sys.fsync(directory)
        } catch {
            _ = Sys.unlinkat(directory, temporary)
            throw error
        }
    }

    /// Reads a whole small file under `.baton`; `nil` when it does not exist.
    package func readFile(_ relativePath: String) throws -> [UInt8]? {
        switch Sys.readFile(directory, relativePath) {
        case .success(let bytes): return bytes
        case .failure(let error) where error.errno == ENOENT: return nil
        case .failure(let error): throw BatonError.system(error, "reading \(batonPath)/\(relativePath)")
        }
    }
}
