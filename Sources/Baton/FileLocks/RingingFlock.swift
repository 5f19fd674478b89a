import CBatonShims

/// A short exclusive `flock` for one step of the library's own bookkeeping (rebuilding the
/// signal table, initialising a defaults suite's meta after a boot), whose waiters sleep in the
/// kernel instead of polling.
///
/// Next to the lock lives a *release word* in a mapping of the same file (its offset is the
/// caller's layout): every holder bumps and rings it (``AddressWait``) after it unlocks, so a
/// waiter that saw the lock taken sleeps on the word and is woken by the release itself. A
/// holder that died rings nothing (the kernel drops its lock): a waiter notices that at the
/// backstop. A holder that never lets go (stopped with SIGSTOP in the middle of its step) makes
/// the waiter give up at `patience` with the caller's `busy` error.
///
/// The word is only a counter: a waiter reads it before it tries the lock, so a release after
/// that read moves it and ends the sleep at once; its value means nothing else, and zero (a
/// file older than the word) is as good as any.
enum RingingFlock {
    /// The longest a waiter sleeps between two tries: a holder that died (the kernel released
    /// its lock, it rang nothing) is noticed within this.
    static let backstopNanoseconds: Int64 = 50_000_000

    /// Runs `body` holding `fd`'s exclusive flock, then releases it and rings `releaseWord`.
    /// - Parameters:
    ///   - fd: An open descriptor of the lock file (the lock is its open file description's).
    ///   - releaseWord: The release word, in a shared mapping of a file every holder maps;
    ///     the caller keeps the mapping alive for the whole call.
    ///   - patience: How long to wait for the lock at most.
    ///   - what: What is being locked, for the error of a failed `flock` ("locking the signal table").
    ///   - busy: The error to throw when `patience` passes.
    static func withLock<R>(
        _ fd: Int32, releaseWord: UnsafeMutablePointer<UInt32>, patience: Duration, what: String,
        busy: () -> BatonError, _ body: () throws -> R
    ) throws -> R {
        let deadline = baton_monotonic_ns() &+ UInt64(patience.nanoseconds)
        while true {
            let seen = baton_load32(releaseWord)
            if try Sys.tryFlock(fd, LOCK_EX).get(what) { break }
            let now = baton_monotonic_ns()
            guard now < deadline else { throw busy() }
            _ = AddressWait.wait(on: releaseWord, expecting: seen, timeoutNanoseconds: min(Int64(deadline - now), backstopNanoseconds))
        }
        defer {
            _ = Sys.flock(fd, LOCK_UN)
            baton_add32(releaseWord, 1)
            AddressWait.wakeAll(releaseWord)
        }
        return try body()
    }
}
