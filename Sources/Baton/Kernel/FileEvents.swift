/// What a ``FileEvents`` subscription listens for. Each says "something may have changed: look
/// again"; none carries data, and a subscriber re-checks what it waits for after every event.
///
/// Kernel-layer primitive: inotify on Linux (`FileEvents+Linux.swift`), kqueue `EVFILT_VNODE` on
/// Apple platforms (`FileEvents+Darwin.swift`). The kernel releases a process's `flock` when the
/// process unlocks, closes the file or dies, so these events are how a waiter learns, without a
/// timer, that a lock it waits for may be free.
package enum FileInterest: Sendable, Hashable {
    /// A lock on this file may have been released (or the file was removed or renamed). Linux:
    /// the file was closed (`IN_CLOSE_WRITE`, `IN_CLOSE_NOWRITE`), deleted, moved or changed
    /// attributes; Apple: `NOTE_FUNLOCK`, `NOTE_DELETE`, `NOTE_RENAME`, `NOTE_REVOKE`, `NOTE_ATTRIB`.
    case lockReleased
    /// The process that holds this file open for writing closed it or died (or the file went).
    /// Linux: `IN_CLOSE_WRITE`, `IN_DELETE_SELF`, `IN_MOVE_SELF` (checks that open the file
    /// read-only wake nobody); Apple: as ``lockReleased``.
    case writerGone
    /// An entry of this directory was added, removed or renamed, or a lock on one of its files
    /// may have been released. Linux: `IN_CREATE`, `IN_DELETE`, `IN_MOVED_*`, `IN_CLOSE_*` of
    /// its files; Apple: `NOTE_WRITE` on the directory and `NOTE_FUNLOCK` on each of its files.
    case directoryChanged
    /// A file of this directory that a process held open for writing was closed (the process
    /// unlocked it or died), or an entry was added or removed. Linux: `IN_CLOSE_WRITE` of its
    /// files; Apple: as ``directoryChanged``.
    case writerGoneInDirectory
}
