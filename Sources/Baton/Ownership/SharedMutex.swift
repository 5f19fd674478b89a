import CBatonShims

/// A mutual-exclusion lock in memory shared between processes, whose owner's death is seen
/// through the owner's kernel-released token (``OwnerTokens``) instead of a robust mutex (which
/// Apple platforms lack).
///
/// Layout (16 bytes, 8-byte aligned, all zero when free):
/// ```
/// 0  owner     (u64) 0 when free, else the owner's token
/// 8  sequence  (u32) moved by an unlock while someone may sleep, and by an owner's death;
///                    waiters sleep on it
/// 12 sleepers  (u32) waiters that may be asleep (an unlock makes a wake call only then)
/// ```
/// Taking it is one compare-and-swap when free. A waiter spins briefly (holders keep it for
/// microseconds), then sleeps on `sequence` in the kernel (``AddressWait``). A waiter that slept
/// for ``patience`` without an unlock checks whether the owner lives; if it does, it watches the
/// owner's token (``OwnerTokens/watch(_:callback:)``), whose release rings `sequence`, and sleeps
/// until then or its deadline: no timer polls. The waiter that takes the lock from a dead owner
/// is told so (``Acquired/ownerDied``) and repairs what the owner may have left half done.
///
/// Critical sections must not suspend (no `await` inside) and must be bracketed by
/// ``OwnerTokens/enter()``/``OwnerTokens/leave()``, so that the container's suspension waits for
/// them before it releases the token.
package struct SharedMutex: @unchecked Sendable {
    // @unchecked: a pointer into shared memory that the caller keeps mapped; touched only with
    // atomics.
    package static let size = 16
    /// How long a waiter sleeps before it checks on the owner.
    package static let patience: Duration = .microseconds(500)
    private static let spins = 64

    package let base: UnsafeMutableRawPointer

    package init(_ base: UnsafeMutableRawPointer) { self.base = base }

    /// What taking the lock found.
    package enum Acquired: Sendable, Equatable {
        case clean
        /// The previous owner died (or was suspended, or its token was forged) holding it:
        /// repair the state it protects.
        case ownerDied
    }

    private var owner: UnsafeMutablePointer<UInt64> { base.assumingMemoryBound(to: UInt64.self) }
    private var sequence: UnsafeMutablePointer<UInt32> { base.advanced(by: 8).assumingMemoryBound(to: UInt32.self) }
    private var sleepers: UnsafeMutablePointer<UInt32> { base.advanced(by: 12).assumingMemoryBound(to: UInt32.self) }

    /// Resets the words (a new file).
    package func initialize() {
        baton_store64(owner, 0)
        baton_store32(sequence, 0)
        baton_store32(sleepers, 0)
    }

    /// The current owner's token (0 when free).
    package var currentOwner: UInt64 { baton_load64(owner) }

    /// Takes the lock for `token`.
    /// - Parameters:
    ///   - token: The caller's owner token (from ``OwnerTokens/enter()``).
    ///   - tokens: Where owners' liveness is checked; `nil` for memory private to this process
    ///     (the owner is then always alive).
    ///   - deadline: When to give up.
    ///   - keepAlive: An object that keeps the memory mapped (a death watch may ring the word
    ///     shortly after this call returned).
    /// - Returns: How it was taken, or `nil` at the deadline.
    package func lock(as token: UInt64, tokens: OwnerTokens?, deadline: Deadline, keepAlive: some AnyObject & Sendable) -> Acquired? {
        if baton_cas64(owner, 0, token) != 0 { return .clean }
        for _ in 0..<Self.spins {
            baton_cpu_relax()
            if baton_load64(owner) == 0, baton_cas64(owner, 0, token) != 0 { return .clean }
        }
        return lockSlowly(as: token, tokens: tokens, deadline: deadline, keepAlive: keepAlive)
    }

    /// ``lock(as:tokens:deadline:keepAlive:)`` with a deadline `patience` after the first
    /// attempt: the clock is read only when the mutex was not free at once (a free mutex, the
    /// usual case, costs one compare-and-swap).
    package func lock(as token: UInt64, tokens: OwnerTokens?, patience: Duration, keepAlive: some AnyObject & Sendable) -> Acquired? {
        if baton_cas64(owner, 0, token) != 0 { return .clean }
        return lock(as: token, tokens: tokens, deadline: .after(patience), keepAlive: keepAlive)
    }

    private func lockSlowly(as token: UInt64, tokens: OwnerTokens?, deadline: Deadline, keepAlive: some AnyObject & Sendable) -> Acquired? {
        var patient = true
        var watch: (token: UInt64, subscription: FileEvents.Subscription?)?
        defer { withExtendedLifetime(watch) {} }
        let ring = Ring(word: sequence, keepAlive: keepAlive)
        while true {
            let seen = baton_load32(sequence)
            let holder = baton_load64(owner)
            if holder == 0 {
                if baton_cas64(owner, 0, token) != 0 { return .clean }
                continue
            }
            if !patient, let tokens {
                // Watch first, then check: a death in between rings the word.
                if watch?.token != holder { watch = (holder, tokens.watch(holder) { ring.ring() }) }
                if !tokens.isAlive(holder) {
                    if baton_cas64(owner, holder, token) != 0 { return .ownerDied }
                    continue
                }
            }
            var timeout = deadline.sleepTimeout
            if timeout == 0 { return nil }
            if patient { timeout = timeout < 0 ? Self.patience.nanoseconds : min(timeout, Self.patience.nanoseconds) }
            baton_add32(sleepers, 1)
            var outcome = AddressWait.Outcome.woken
            if baton_load64(owner) == holder {
                outcome = AddressWait.wait(on: sequence, expecting: seen, timeoutNanoseconds: timeout)
            }
            baton_sub32(sleepers, 1)
            if outcome == .timedOut, patient, baton_load32(sequence) == seen { patient = false }
        }
    }

    /// Releases the lock held by `token` (a lock taken over meanwhile is left alone).
    ///
    /// Uncontended, this is one compare-and-swap and one load: `sequence` moves only when someone
    /// may sleep. (A waiter counts itself in `sleepers` before its last look at `owner`; an
    /// unlock that read no sleeper came before that look, which then finds the lock free.)
    package func unlock(as token: UInt64) {
        guard baton_cas64(owner, token, 0) != 0 else { return }
        guard baton_load32(sleepers) > 0 else { return }
        baton_add32(sequence, 1)
        AddressWait.wakeAll(sequence)
    }

    /// Rings the sequence word from a death watch, keeping the memory mapped meanwhile.
    private struct Ring: @unchecked Sendable {
        // @unchecked: `word` stays mapped while `keepAlive` lives; touched with atomics only.
        let word: UnsafeMutablePointer<UInt32>
        let keepAlive: any AnyObject & Sendable
        func ring() {
            withExtendedLifetime(keepAlive) {
                baton_add32(word, 1)
                AddressWait.wakeAll(word)
            }
        }
    }
}
