#if os(Linux)
import CBatonShims

/// The lock a writer holds for the duration of one append: a process-shared, robust pthread
/// mutex in the suite's meta file (about 50 ns uncontended, against about 1 µs for a pair of
/// `flock(2)` calls). When its owner dies holding it, the next locker is told so
/// (`EOWNERDEAD`) and repairs the log's tail before calling ``markConsistent(_:)``.
///
/// It is never held between calls: nothing to release before suspension.
enum DefaultsWriteLock {
    /// What taking the lock found.
    enum Acquired {
        case clean
        /// The previous owner died holding it: repair, then call `markConsistent`.
        case ownerDied
    }

    static func initialize(_ memory: UnsafeMutableRawPointer) throws {
        let result = baton_robust_mutex_init(memory)
        guard result == 0 else {
            throw BatonError.system(SystemCallError(call: "pthread_mutex_init", errno: result), "initialising the shared defaults writer lock")
        }
    }

    /// Takes the lock, waiting at most `timeout`.
    /// - Throws: `busy` when another process held it past the timeout; `corrupt` when the lock
    ///   is unrecoverable.
    static func lock(_ meta: DefaultsMeta, timeout: Duration, suite: String) throws -> Acquired {
        let (seconds, attoseconds) = timeout.components
        let nanoseconds = seconds * 1_000_000_000 + attoseconds / 1_000_000_000
        switch baton_robust_mutex_lock(meta.lockMemory, nanoseconds) {
        case 0: return .clean
        case EOWNERDEAD: return .ownerDied
        case ETIMEDOUT:
            throw BatonError(.busy, "another process held the writer lock of defaults suite \"\(suite)\" for more than \(timeout); it may be stopped (SIGSTOP) in the middle of a write. Retry later.")
        case ENOTRECOVERABLE:
            throw BatonError(.corrupt, "the writer lock of defaults suite \"\(suite)\" is unrecoverable; delete its .meta file while no process uses the suite")
        case let code:
            throw BatonError.system(SystemCallError(call: "pthread_mutex_lock", errno: code), "locking defaults suite \"\(suite)\"")
        }
    }

    static func markConsistent(_ meta: DefaultsMeta) {
        _ = baton_robust_mutex_consistent(meta.lockMemory)
    }

    static func unlock(_ meta: DefaultsMeta) {
        _ = baton_robust_mutex_unlock(meta.lockMemory)
    }

    /// Identifies this boot of the machine: a robust mutex left locked by a process of an earlier
    /// boot would never be released, so the meta file is rebuilt when this changes.
    static func bootID() -> [UInt8] {
        (try? Sys.readFile(AT_FDCWD, "/proc/sys/kernel/random/boot_id", limit: 64).get("reading the boot id")) ?? []
    }

    /// Allocates `size` bytes for the file so that a full disk surfaces here as an error, never
    /// later as a SIGBUS on a write to the mapping.
    static func allocate(_ fd: Int32, size: Int) -> Int32 {
        var result: Int32
        repeat { result = posix_fallocate(fd, 0, off_t(size)) } while result == EINTR
        return result
    }
}
#endif
