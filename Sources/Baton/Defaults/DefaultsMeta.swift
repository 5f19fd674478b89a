import CBatonShims

/// The small shared file beside a suite's log, `.baton/defaults/<suite>.meta`, mapped by every
/// process of the suite. It is never replaced (the log is, on compaction), so it is where
/// processes meet:
///
/// ```
///   0 magic "BATNDMT1"   8 version   16 boot id (40 bytes of ASCII; the meta is rebuilt after a reboot)
///  64 the writer lock (a ``SharedMutex``, 16 bytes; 64 reserved)
/// 128 committed (u64): generation << 40 | length of the valid records in the current log
/// 136 pending end (u64): where the writer holding the lock is appending to (torn-tail repair)
/// 144 watchers (u32): how many observations exist, so writers ring the suite's signal only then
/// ```
///
/// A reader checks `committed` with one atomic load: unchanged means nothing to do.
final class DefaultsMeta: @unchecked Sendable {
    // @unchecked: the pointers are immutable and point into a mapping that lives as long as
    // `file` (never remapped); the words they point to are shared with other processes and
    // only touched with atomics (CBatonShims) or under the writer lock.
    static let magic: UInt64 = 0x3154_4D44_4E54_4142 // "BATNDMT1" little-endian
    /// 2: the writer lock is a ``SharedMutex`` (version 1 held a robust pthread mutex).
    static let version: UInt32 = 2
    static let size = 4096
    static let bootIDOffset = 16, bootIDLength = 40
    static let lockOffset = 64
    static let committedOffset = 128, pendingEndOffset = 136, watchersOffset = 144
    /// The release word of the initialisation lock (``RingingFlock``): never reset, so it
    /// keeps counting across re-initialisations (zero in files older than it).
    static let initializationReleasesOffset = 152

    let file: MappedFile
    let base: UnsafeMutableRawPointer
    let committed: UnsafeMutablePointer<UInt64>
    let pendingEnd: UnsafeMutablePointer<UInt64>
    let watchers: UnsafeMutablePointer<UInt32>
    let lockMemory: UnsafeMutableRawPointer
    let initializationReleases: UnsafeMutablePointer<UInt32>

    init(file: MappedFile) {
        self.file = file
        base = file.pointer
        committed = base.advanced(by: Self.committedOffset).assumingMemoryBound(to: UInt64.self)
        pendingEnd = base.advanced(by: Self.pendingEndOffset).assumingMemoryBound(to: UInt64.self)
        watchers = base.advanced(by: Self.watchersOffset).assumingMemoryBound(to: UInt32.self)
        lockMemory = base.advanced(by: Self.lockOffset)
        initializationReleases = base.advanced(by: Self.initializationReleasesOffset).assumingMemoryBound(to: UInt32.self)
    }

    /// Whether the header was written by this boot of the machine with this format.
    func isValid(bootID: [UInt8]) -> Bool {
        guard file.size >= Self.size,
              baton_load64(base.assumingMemoryBound(to: UInt64.self)) == Self.magic,
              base.load(fromByteOffset: 8, as: UInt32.self) == Self.version
        else { return false }
        for index in 0..<Self.bootIDLength where base.load(fromByteOffset: Self.bootIDOffset + index, as: UInt8.self) != (index < bootID.count ? bootID[index] : 0) {
            return false
        }
        return true
    }

    /// Rewrites the header (the caller holds the meta file's flock, so nobody else initialises
    /// at the same time, and no live process uses an invalid meta).
    func initialize(bootID: [UInt8], committed word: UInt64) {
        baton_store64(base.assumingMemoryBound(to: UInt64.self), 0)
        base.storeBytes(of: Self.version, toByteOffset: 8, as: UInt32.self)
        for index in 0..<Self.bootIDLength {
            base.storeBytes(of: index < bootID.count ? bootID[index] : 0, toByteOffset: Self.bootIDOffset + index, as: UInt8.self)
        }
        DefaultsWriteLock.initialize(lockMemory)
        baton_store64(committed, word)
        baton_store64(pendingEnd, word & DefaultsLogFormat.lengthMask)
        baton_store32(watchers, 0)
        baton_store64(base.assumingMemoryBound(to: UInt64.self), Self.magic)
    }
}
