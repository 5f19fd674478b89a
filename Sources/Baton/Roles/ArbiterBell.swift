import CBatonShims

/// The release bell of a role's arbiter lock: two words at the start of `arbiter.lock`, which
/// every process that opens the role maps (`MAP_SHARED`; the lock is an `flock` on the same
/// file, whose content it does not touch).
///
/// Every unlock of the arbiter, by any process and through any descriptor, adds one to the
/// *release* word (offset 0) and, when the *watcher* word (offset 4) counts anyone, wakes the
/// threads asleep on it (``AddressWait``). A transition that finds the lock held counts itself a
/// watcher, reads the release word, tries the lock once more, and then watches the word: on the
/// processor for ``RoleDirectory/arbiterSpin``, then asleep in the kernel, until a release moves
/// it. It is never rung in vain (only a release moves the word) and it never sleeps through a
/// release: the watcher counts itself before it reads the word, and the releaser reads the count
/// after it moved the word (both sequentially consistent), so either the watcher's read sees the
/// move or the releaser's read sees the watcher.
///
/// The words are counters and hints, never trusted for exclusion (the `flock` is): zeros (a
/// lock file older than the bell) are as good as any value; a holder that dies rings nothing
/// (the kernel drops its lock), and a holder of a Baton older than the bell unlocks without
/// ringing, so a watch is bounded (``RoleDirectory/arbiterWatch``) and a watcher that is still
/// waiting then waits with a blocking `flock` on a thread of its own (``ArbiterWait``). A watcher
/// killed while counted leaves the count one too high for good: each release then makes one
/// wake-up call that finds nobody, nothing worse (the same holds for the change watchers below).
///
/// The *change* word (offset 8) moves once with each unlock that ends a transition which wrote
/// the role's record, and wakes the threads asleep on it when the *change watcher* word (offset
/// 12) counts anyone: an acquisition that has asked the holder to stop sleeps there for a short
/// while (``RoleDirectory/handOverWatch``), so that the holder's release wakes the acquiring
/// thread itself, as a blocking `flock` would, instead of this process's signal thread, which
/// would then hand the acquisition over to a thread of the task's executor. Reads of the record
/// (the holder's look for the stop request) do not move it, so they wake no one. Like the
/// release word, it is a hint: a release by a Baton older than the word rings nothing, and the
/// watch ends at its bound.
///
/// The same code on both kernels: the words are plain atomics in a shared mapping, and the
/// sleep is the kernel layer's ``AddressWait`` (a futex on Linux, `os_sync_wait_on_address` on
/// Apple platforms).
final class ArbiterBell: Sendable {
    /// `arbiter.lock`, mapped (never remapped: its size is fixed at ``size``). Its descriptor
    /// is the one the role's transitions lock.
    private let file: MappedFile

    /// The bytes the bell keeps at the start of `arbiter.lock` (four words used, the rest zero
    /// and free for later use).
    static let size = 64

    /// Opens (creating it when needed) and maps `arbiter.lock` at `relativePath`, extending an
    /// empty lock file (a role made before the bell) to ``size`` zero bytes.
    init(_ container: SharedContainer, relativePath: String) throws {
        file = try MappedFile(container, relativePath: relativePath, minimumSize: Self.size)
    }

    /// The mapping's descriptor: the one the role's transitions `flock`.
    var fd: Int32 { file.fd }

    private var releases: UnsafeMutablePointer<UInt32> { file.pointer.assumingMemoryBound(to: UInt32.self) }
    private var watchers: UnsafeMutablePointer<UInt32> { file.pointer.advanced(by: 4).assumingMemoryBound(to: UInt32.self) }
    private var changes: UnsafeMutablePointer<UInt32> { file.pointer.advanced(by: 8).assumingMemoryBound(to: UInt32.self) }
    private var changeWatchers: UnsafeMutablePointer<UInt32> { file.pointer.advanced(by: 12).assumingMemoryBound(to: UInt32.self) }

    /// Rings the bell: call after every unlock of the arbiter lock (not before: a woken watcher
    /// tries the lock at once), with `changed` when the transition it ended wrote the record.
    func ring(changed: Bool = false) {
        baton_add32(releases, 1)
        if changed {
            baton_add32(changes, 1)
            // First: the thread waiting for a hand-over is the one the release is for.
            if baton_load32(changeWatchers) > 0 { AddressWait.wakeAll(changes) }
        }
        if baton_load32(watchers) > 0 { AddressWait.wakeAll(releases) }
    }

    /// Counts the calling thread a watcher; balance with ``endWatch()``. Call before the
    /// ``releaseCount()`` that a watch starts from.
    func beginWatch() { baton_add32(watchers, 1) }

    /// Ends a watch begun with ``beginWatch()``.
    func endWatch() { baton_sub32(watchers, 1) }

    /// The release word's value now: read it before trying the lock.
    func releaseCount() -> UInt32 { baton_load32(releases) }

    /// How many watches count themselves now (for tests and diagnostics).
    var watcherCount: UInt32 { baton_load32(watchers) }

    /// The change word's value now.
    func changeCount() -> UInt32 { baton_load32(changes) }

    /// Counts the calling thread a watcher of the change word; balance with
    /// ``endChangeWatch()``. Call before comparing the word with the value the watch starts from.
    func beginChangeWatch() { baton_add32(changeWatchers, 1) }

    /// Ends a watch begun with ``beginChangeWatch()``.
    func endChangeWatch() { baton_sub32(changeWatchers, 1) }

    /// How many change watches count themselves now (for tests and diagnostics).
    var changeWatcherCount: UInt32 { baton_load32(changeWatchers) }

    /// Sleeps in the kernel until the change word moves past `seen` (true) or until `end`
    /// (monotonic nanoseconds, ``baton_monotonic_ns()``; false). No spin: a holder takes tens of
    /// microseconds at least to close what it holds and release.
    func waitForChange(after seen: UInt32, until end: UInt64) -> Bool {
        Self.wait(on: changes, after: seen, spinningUntil: 0, until: end)
    }

    /// Waits until the release word moves past `seen`, watching it on the processor until
    /// `spinEnd` and then asleep in the kernel until `end` (both monotonic nanoseconds,
    /// ``baton_monotonic_ns()``), or returns at `end`. A wake may be spurious: the caller tries
    /// the lock again either way.
    func wait(after seen: UInt32, spinningUntil spinEnd: UInt64, until end: UInt64) {
        _ = Self.wait(on: releases, after: seen, spinningUntil: spinEnd, until: end)
    }

    /// The watch of both words: until `word` moves past `seen` (true) or `end` passes (false),
    /// on the processor until `spinEnd`, then asleep in the kernel.
    private static func wait(on word: UnsafeMutablePointer<UInt32>, after seen: UInt32, spinningUntil spinEnd: UInt64, until end: UInt64) -> Bool {
        while baton_load32(word) == seen {
            let now = baton_monotonic_ns()
            guard now < end else { return false }
            if now < spinEnd {
                for _ in 0..<32 { baton_cpu_relax() }
                continue
            }
            _ = AddressWait.wait(on: word, expecting: seen, timeoutNanoseconds: Int64(end - now))
        }
        return true
    }
}
