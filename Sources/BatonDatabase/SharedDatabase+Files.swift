import Baton

extension SharedDatabase {
    /// Checks the database file and its `-wal` and `-shm` before SQLite opens them, and creates
    /// the database file with mode 0600 when it is missing and `create` is set: SQLite gives the
    /// `-wal` and `-shm` files the database file's mode, so none of the three depends on the
    /// umask.
    ///
    /// Each file that exists must be a regular file (a FIFO in its place would block SQLite's
    /// `open` forever); unless `trustsOtherUsers`, it must also belong to this process's user and
    /// not be writable by group or others (another user could otherwise replace what this
    /// process reads). Each is opened with `O_NONBLOCK`, so the check itself never blocks.
    ///
    /// - Throws: `notARegularFile`, `ownedByAnotherUser`, `writableByOthers`, or the failure of
    ///   `open` (`notWritable` when the directory is not writable).
    package static func checkFiles(at path: String, create: Bool, trustsOtherUsers: Bool) throws {
        for suffix in ["", "-wal", "-shm"] {
            let file = path + suffix
            let creating = create && suffix.isEmpty
            let flags = (creating ? O_RDWR | O_CREAT : O_RDONLY) | O_NONBLOCK | O_CLOEXEC
            var fd: Int32
            repeat { fd = openNonBlocking(file, flags) } while fd == -1 && errno == EINTR
            if fd == -1 {
                let error = SystemCallError(call: "open", errno: errno)
                switch error.errno {
                case ENOENT where !creating: continue
                case EISDIR, ENXIO:
                    throw BatonError(.notARegularFile, "\(file) is not a regular file (a directory, FIFO or device is in its place); remove it", cause: error)
                case EACCES, EPERM, EROFS:
                    throw BatonError(.notWritable, "cannot open \(file): check the file's and its directory's permissions", cause: error)
                case ENOENT:
                    throw BatonError(.notFound, "cannot create \(file): its directory does not exist", cause: error)
                default:
                    throw BatonError(.systemCallFailed, "opening \(file) failed: \(error)", cause: error)
                }
            }
            defer { closeDescriptor(fd) }
            var info = stat()
            guard fstat(fd, &info) == 0 else {
                throw BatonError(.systemCallFailed, "checking \(file) failed", cause: SystemCallError(call: "fstat", errno: errno))
            }
            guard info.st_mode & S_IFMT == S_IFREG else {
                throw BatonError(.notARegularFile, "\(file) is not a regular file (a FIFO, directory, device or socket is in its place); remove it")
            }
            guard !trustsOtherUsers else { continue }
            guard info.st_uid == geteuid() else {
                throw BatonError(.ownedByAnotherUser, "\(file) belongs to user \(info.st_uid), not to this process's user \(geteuid()): another user may have replaced it. Remove it, or set SharedDatabase.Configuration.trustsOtherUsers to share it deliberately")
            }
            guard info.st_mode & 0o022 == 0 else {
                throw BatonError(.writableByOthers, "\(file) may be written by other users (mode \(String(info.st_mode & 0o7777, radix: 8))), who could forge its content; remove their write permission (chmod go-w) or set SharedDatabase.Configuration.trustsOtherUsers")
            }
        }
    }
}

// libc under names that `SharedDatabase.open` does not shadow.
private func openNonBlocking(_ path: String, _ flags: Int32) -> Int32 { open(path, flags, 0o600) }
private func closeDescriptor(_ fd: Int32) { _ = close(fd) }
