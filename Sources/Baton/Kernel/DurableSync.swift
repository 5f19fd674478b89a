/// Flushing a file's data to permanent storage, so that a write that returned survives a power
/// loss: `fdatasync` on Linux (`DurableSync+Linux.swift`); `fcntl(F_FULLFSYNC)` on Apple
/// platforms (`DurableSync+Darwin.swift`), because Apple's `fsync` leaves the data in the drive's
/// cache, with `fsync` where the file system refuses `F_FULLFSYNC`.
package enum DurableSync {}
