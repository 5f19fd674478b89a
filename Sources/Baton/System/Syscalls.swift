import CBatonShims

/// One wrapper per libc call. Each retries on `EINTR`, treats `EBADF` and `EFAULT` as
/// programming errors, and returns every other failure with the call's name and errno.
enum Sys {
    @inline(__always)
    static func retrying<T: FixedWidthInteger>(
        _ name: StaticString,
        _ body: () -> T
    ) -> Result<T, SystemCallError> {
        while true {
            let result = body()
            if result != -1 { return .success(result) }
            let code = baton_errno()
            if code == EINTR { continue }
            if code == EBADF || code == EFAULT {
                preconditionFailure("\(name)() failed with errno \(code): a Baton bug (bad descriptor or address)")
            }
            return .failure(SystemCallError(call: "\(name)", errno: code))
        }
    }

    static func openat(_ dir: Int32, _ path: String, _ flags: Int32, _ mode: mode_t = 0o600) -> Result<Int32, SystemCallError> {
        retrying("openat") { baton_openat(dir, path, flags | O_CLOEXEC | O_NOFOLLOW, mode) }
    }

    /// `open` of an absolute or relative path. `O_NOFOLLOW` is the caller's choice here
    /// because the container directory itself may legitimately be reached through a link.
    static func open(_ path: String, _ flags: Int32, _ mode: mode_t = 0o600) -> Result<Int32, SystemCallError> {
        retrying("open") { baton_openat(AT_FDCWD, path, flags | O_CLOEXEC, mode) }
    }

    static func close(_ fd: Int32) {
        // close(2) must not be retried on EINTR on Linux: the descriptor is already gone.
        if libc_close(fd) == -1, baton_errno() == EBADF {
            preconditionFailure("close(\(fd)) failed with EBADF: a Baton bug (descriptor closed twice)")
        }
    }

    /// Releases a lock held on `fd` and closes it. `LOCK_UN` removes the lock from the open file
    /// description itself, so the lock is gone even while a child forked by `posix_spawn` (in
    /// this or any library) still shares the descriptor until it execs; a plain `close` would
    /// leave the lock held until then.
    static func unlockAndClose(_ fd: Int32) {
        _ = libc_flock(fd, LOCK_UN)
        close(fd)
    }

    static func flock(_ fd: Int32, _ operation: Int32) -> Result<Void, SystemCallError> {
        retrying("flock") { libc_flock(fd, operation) }.map { _ in () }
    }

    /// Non-blocking flock: `true` when taken, `false` when someone else holds a conflicting lock.
    static func tryFlock(_ fd: Int32, _ operation: Int32) -> Result<Bool, SystemCallError> {
        switch flock(fd, operation | LOCK_NB) {
        case .success: return .success(true)
        case .failure(let error) where error.errno == EWOULDBLOCK: return .success(false)
        case .failure(let error): return .failure(error)
        }
    }

    static func fstat(_ fd: Int32) -> Result<stat, SystemCallError> {
        var info = stat()
        return retrying("fstat") { libc_fstat(fd, &info) }.map { _ in info }
    }

    static func fstatat(_ dir: Int32, _ path: String, followLinks: Bool = false) -> Result<stat, SystemCallError> {
        var info = stat()
        let flags = followLinks ? 0 : AT_SYMLINK_NOFOLLOW
        return retrying("fstatat") { libc_fstatat(dir, path, &info, flags) }.map { _ in info }
    }

    static func mkdirat(_ dir: Int32, _ path: String, _ mode: mode_t) -> Result<Void, SystemCallError> {
        retrying("mkdirat") { libc_mkdirat(dir, path, mode) }.map { _ in () }
    }

    static func ftruncate(_ fd: Int32, _ size: Int) -> Result<Void, SystemCallError> {
        retrying("ftruncate") { libc_ftruncate(fd, off_t(size)) }.map { _ in () }
    }

    static func fsync(_ fd: Int32) -> Result<Void, SystemCallError> {
        retrying("fsync") { libc_fsync(fd) }.map { _ in () }
    }

    static func fdatasync(_ fd: Int32) -> Result<Void, SystemCallError> {
        retrying("fdatasync") { libc_fdatasync(fd) }.map { _ in () }
    }

    static func fchmod(_ fd: Int32, _ mode: mode_t) -> Result<Void, SystemCallError> {
        retrying("fchmod") { libc_fchmod(fd, mode) }.map { _ in () }
    }

    static func renameat(_ fromDir: Int32, _ from: String, _ toDir: Int32, _ to: String) -> Result<Void, SystemCallError> {
        retrying("renameat") { libc_renameat(fromDir, from, toDir, to) }.map { _ in () }
    }

    static func unlinkat(_ dir: Int32, _ path: String, _ flags: Int32 = 0) -> Result<Void, SystemCallError> {
        retrying("unlinkat") { libc_unlinkat(dir, path, flags) }.map { _ in () }
    }

    /// Writes the whole buffer at `offset` (pwrite loops over short writes).
    static func pwriteAll(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, at offset: Int) -> Result<Void, SystemCallError> {
        var done = 0
        while done < buffer.count {
            let result = retrying("pwrite") {
                libc_pwrite(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset + done))
            }
            switch result {
            case .success(let count): done += count
            case .failure(let error): return .failure(error)
            }
        }
        return .success(())
    }

    /// Reads up to `buffer.count` bytes at `offset`; returns how many were read (less at end of file).
    static func preadAll(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, at offset: Int) -> Result<Int, SystemCallError> {
        var done = 0
        while done < buffer.count {
            let result = retrying("pread") {
                libc_pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset + done))
            }
            switch result {
            case .success(0): return .success(done)
            case .success(let count): done += count
            case .failure(let error): return .failure(error)
            }
        }
        return .success(done)
    }

    static func mmap(_ fd: Int32, size: Int, writable: Bool) -> Result<UnsafeMutableRawPointer, SystemCallError> {
        let protection = writable ? (PROT_READ | PROT_WRITE) : PROT_READ
        guard let pointer = libc_mmap(nil, size, protection, MAP_SHARED, fd, 0), pointer != MAP_FAILED else {
            return .failure(SystemCallError(call: "mmap", errno: baton_errno()))
        }
        return .success(pointer)
    }

    static func munmap(_ pointer: UnsafeMutableRawPointer, size: Int) {
        _ = libc_munmap(pointer, size)
    }

    static func msync(_ pointer: UnsafeMutableRawPointer, size: Int) -> Result<Void, SystemCallError> {
        retrying("msync") { libc_msync(pointer, size, MS_SYNC) }.map { _ in () }
    }

    static func kill(_ pid: pid_t, _ signal: Int32) -> Result<Void, SystemCallError> {
        retrying("kill") { libc_kill(pid, signal) }.map { _ in () }
    }

    /// Reads a whole (small) file relative to a directory descriptor.
    static func readFile(_ dir: Int32, _ path: String, limit: Int = 1 << 20) -> Result<[UInt8], SystemCallError> {
        openat(dir, path, O_RDONLY).flatMap { fd in
            defer { close(fd) }
            var bytes: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 4096)
            while bytes.count < limit {
                let result = chunk.withUnsafeMutableBytes { buffer in
                    retrying("read") { libc_read(fd, buffer.baseAddress!, buffer.count) }
                }
                switch result {
                case .success(0): return .success(bytes)
                case .success(let count): bytes.append(contentsOf: chunk[0..<count])
                case .failure(let error): return .failure(error)
                }
            }
            return .success(bytes)
        }
    }
}

extension Result where Failure == SystemCallError {
    /// Unwraps, turning a failure into a ``BatonError`` that says what Baton was doing.
    @inline(__always)
    func get(_ doing: @autoclosure () -> String, file: String = #fileID, line: Int = #line) throws -> Success {
        switch self {
        case .success(let value): return value
        case .failure(let error): throw BatonError.system(error, doing(), file: file, line: line)
        }
    }
}

// libc entry points under names that the wrappers above do not shadow.
@inline(__always) private func libc_close(_ fd: Int32) -> Int32 { close(fd) }
@inline(__always) private func libc_fchmod(_ fd: Int32, _ mode: mode_t) -> Int32 { fchmod(fd, mode) }
@inline(__always) private func libc_flock(_ fd: Int32, _ op: Int32) -> Int32 { flock(fd, op) }
@inline(__always) private func libc_fstat(_ fd: Int32, _ info: UnsafeMutablePointer<stat>) -> Int32 { fstat(fd, info) }
@inline(__always) private func libc_fstatat(_ dir: Int32, _ path: String, _ info: UnsafeMutablePointer<stat>, _ flags: Int32) -> Int32 { fstatat(dir, path, info, flags) }
@inline(__always) private func libc_fsync(_ fd: Int32) -> Int32 { fsync(fd) }
@inline(__always) private func libc_ftruncate(_ fd: Int32, _ size: off_t) -> Int32 { ftruncate(fd, size) }
@inline(__always) private func libc_kill(_ pid: pid_t, _ sig: Int32) -> Int32 { kill(pid, sig) }
@inline(__always) private func libc_mkdirat(_ dir: Int32, _ path: String, _ mode: mode_t) -> Int32 { mkdirat(dir, path, mode) }
@inline(__always) private func libc_mmap(_ addr: UnsafeMutableRawPointer?, _ size: Int, _ prot: Int32, _ flags: Int32, _ fd: Int32, _ offset: off_t) -> UnsafeMutableRawPointer? { mmap(addr, size, prot, flags, fd, offset) }
@inline(__always) private func libc_msync(_ p: UnsafeMutableRawPointer, _ size: Int, _ flags: Int32) -> Int32 { msync(p, size, flags) }
@inline(__always) private func libc_munmap(_ p: UnsafeMutableRawPointer, _ size: Int) -> Int32 { munmap(p, size) }
@inline(__always) private func libc_pread(_ fd: Int32, _ p: UnsafeMutableRawPointer, _ n: Int, _ o: off_t) -> Int { pread(fd, p, n, o) }
@inline(__always) private func libc_pwrite(_ fd: Int32, _ p: UnsafeRawPointer, _ n: Int, _ o: off_t) -> Int { pwrite(fd, p, n, o) }
@inline(__always) private func libc_read(_ fd: Int32, _ p: UnsafeMutableRawPointer, _ n: Int) -> Int { read(fd, p, n) }
@inline(__always) private func libc_renameat(_ a: Int32, _ from: String, _ b: Int32, _ to: String) -> Int32 { renameat(a, from, b, to) }
@inline(__always) private func libc_unlinkat(_ dir: Int32, _ path: String, _ flags: Int32) -> Int32 { unlinkat(dir, path, flags) }
