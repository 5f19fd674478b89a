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
    /// process reads).
    ///
    /// The files are looked at with `stat`, never opened: SQLite's locks are POSIX record locks,
    /// which belong to the process and the file, and closing *any* descriptor of the file drops
    /// them all (sqlite.org, "How To Corrupt An SQLite Database File", 2.2). A check that opened
    /// and closed the `-shm` while another connection of this process had the database open
    /// (a second `SharedDatabase` or `Inbox` on the same file, as two notification-extension
    /// instances in one process have) released that connection's lock on the WAL index: the
    /// next process to open the database then truncated the `-shm` under this process's
    /// mapping (SIGBUS in SQLite). The one file this opens is one it creates (`O_EXCL`), which
    /// no connection can have had open.
    ///
    /// - Throws: `notARegularFile`, `ownedByAnotherUser`, `writableByOthers`, or the failure of
    ///   `stat` or `open` (`notWritable` when the directory is not writable).
    package static func checkFiles(at path: String, create: Bool, trustsOtherUsers: Bool) throws {
        if create { try createIfMissing(path) }
        for suffix in ["", "-wal", "-shm"] {
            let file = path + suffix
            var info = stat()
            guard stat(file, &info) == 0 else {
                let error = SystemCallError(call: "stat", errno: errno)
                switch error.errno {
                case ENOENT: continue
                case EACCES, EPERM:
                    throw BatonError(.notWritable, "cannot look at \(file): check its directory's permissions", cause: error)
                default:
                    throw BatonError(.systemCallFailed, "checking \(file) failed: \(error)", cause: error)
                }
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

    /// Creates the database file with mode 0600 when nothing is at `path` (`O_EXCL`: an existing
    /// file, or a FIFO, is left alone and never opened; `checkFiles` looks at it next).
    private static func createIfMissing(_ path: String) throws {
        var fd: Int32
        repeat { fd = openNonBlocking(path, O_RDWR | O_CREAT | O_EXCL | O_NONBLOCK | O_CLOEXEC) } while fd == -1 && errno == EINTR
        if fd >= 0 { closeDescriptor(fd); return }
        let error = SystemCallError(call: "open", errno: errno)
        switch error.errno {
        case EEXIST: return // a directory too (O_EXCL): checkFiles refuses it next
        case EACCES, EPERM, EROFS:
            throw BatonError(.notWritable, "cannot create \(path): check its directory's permissions", cause: error)
        case ENOENT:
            throw BatonError(.notFound, "cannot create \(path): its directory does not exist", cause: error)
        default:
            throw BatonError(.systemCallFailed, "creating \(path) failed: \(error)", cause: error)
        }
    }
}

// libc under names that `SharedDatabase.open` does not shadow.
private func openNonBlocking(_ path: String, _ flags: Int32) -> Int32 { open(path, flags, 0o600) }
private func closeDescriptor(_ fd: Int32) { _ = close(fd) }
