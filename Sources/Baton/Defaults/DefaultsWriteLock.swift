import CBatonShims

/// The lock a writer holds for the duration of one append: a ``SharedMutex`` in the suite's meta
/// file, owned through this process's owner token (``OwnerTokens``). Uncontended, taking and
/// releasing it is two compare-and-swaps. When its owner dies (or is suspended: a suspension
/// waits for the append to end first, so that cannot happen mid-append) the next writer takes it
/// over and is told so, and repairs the log's tail.
///
/// It is never held between calls: nothing to release before suspension.
enum DefaultsWriteLock {
    /// What taking the lock found.
    enum Acquired {
        case clean
        /// The previous owner died holding it: repair.
        case ownerDied
    }

    static func initialize(_ memory: UnsafeMutableRawPointer) {
        SharedMutex(memory).initialize()
    }

    /// Takes the lock for this process's token (entering a critical section of ``OwnerTokens``),
    /// waiting at most `timeout`. Pair with ``unlock(_:token:tokens:)``.
    /// - Throws: `busy` when another live process held it past the timeout; `suspended` while
    ///   the container is suspended.
    static func lock(_ meta: DefaultsMeta, tokens: OwnerTokens, timeout: Duration, suite: String) throws -> (Acquired, token: UInt64) {
        let token = try tokens.enter()
        let mutex = SharedMutex(meta.lockMemory)
        switch mutex.lock(as: token, tokens: tokens, patience: timeout, keepAlive: meta.file) {
        case .clean?: return (.clean, token)
        case .ownerDied?: return (.ownerDied, token)
        case nil:
            tokens.leave()
            throw BatonError(.busy, "another process held the writer lock of defaults suite \"\(suite)\" for more than \(timeout); it may be stopped (SIGSTOP) in the middle of a write. Retry later.")
        }
    }

    static func unlock(_ meta: DefaultsMeta, token: UInt64, tokens: OwnerTokens) {
        SharedMutex(meta.lockMemory).unlock(as: token)
        tokens.leave()
    }

    /// Grows the file behind `fd` to `size` bytes with its blocks allocated, so that a full disk
    /// surfaces here as an error, never later as a SIGBUS on a write to the mapping. Returns 0
    /// or an errno.
    static func allocate(_ fd: Int32, size: Int) -> Int32 {
        var info = stat()
        let current = fstat(fd, &info) == 0 ? Int(info.st_size) : 0
        guard size > current else { return 0 }
        return FileSpace.allocate(fd, from: current, to: size)
    }
}
