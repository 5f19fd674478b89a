#if canImport(Darwin)
import CBatonShims

/// The writer lock on Apple platforms: `flock(2)` on the meta file (Darwin has no robust
/// process-shared mutex). The kernel releases it when its owner dies; a torn tail is detected by
/// the meta's pending-end word instead of `EOWNERDEAD`. Thin and untested (Linux is where the
/// tests run).
enum DefaultsWriteLock {
    enum Acquired {
        case clean
        case ownerDied
    }

    static func initialize(_ memory: UnsafeMutableRawPointer) throws {
        memory.initializeMemory(as: UInt8.self, repeating: 0, count: 64)
    }

    static func lock(_ meta: DefaultsMeta, timeout: Duration, suite: String) throws -> Acquired {
        let fd = meta.file.fd
        let deadline = ContinuousClock.now + timeout
        while true {
            switch Sys.tryFlock(fd, LOCK_EX) {
            case .success(true): return .clean
            case .success(false):
                if ContinuousClock.now >= deadline {
                    throw BatonError(.busy, "another process held the writer lock of defaults suite \"\(suite)\" for more than \(timeout). Retry later.")
                }
                usleep(50)
            case .failure(let error): throw BatonError.system(error, "locking defaults suite \"\(suite)\"")
            }
        }
    }

    static func markConsistent(_ meta: DefaultsMeta) {}

    static func unlock(_ meta: DefaultsMeta) { _ = Sys.flock(meta.file.fd, LOCK_UN) }

    static func bootID() -> [UInt8] {
        var boot = timeval()
        var size = MemoryLayout<timeval>.size
        sysctlbyname("kern.boottime", &boot, &size, nil, 0)
        return Array("\(boot.tv_sec).\(boot.tv_usec)".utf8)
    }

    static func allocate(_ fd: Int32, size: Int) -> Int32 {
        if ftruncate(fd, off_t(size)) != 0 { return errno }
        return 0
    }
}
#endif
