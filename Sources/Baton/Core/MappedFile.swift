import CBatonShims
/// A file under `.baton` mapped into memory with `MAP_SHARED`, so every process that maps it
/// sees the same bytes. Used for the signal table, the defaults log and channels.
///
/// The mapping is fixed-size; grow it with ``remap(size:)`` from one task at a time.
/// Cross-process access to the bytes must use atomics or a lock; this type only owns the
/// mapping.
package final class MappedFile: @unchecked Sendable {
    // @unchecked: `pointer` and `size` are written only by `remap`, which callers serialise
    // (each owner does it under its own Mutex); readers go through the owner's lock. The same
    // holds for the repair bookkeeping (`repairsChecked`, `repairCarried`), written by `remap`
    // and `cutShortSinceLastCheck()` under the owner's lock. So the properties skip Swift's
    // dynamic exclusivity check (`@exclusivity(unchecked)`), which every read of a class's
    // stored property otherwise makes: the signal thread reads `pointer` a dozen times a round.
    @exclusivity(unchecked) package private(set) var pointer: UnsafeMutableRawPointer
    @exclusivity(unchecked) package private(set) var size: Int
    /// The mapped file, open for as long as the mapping lives.
    private let descriptor: FileDescriptor
    /// ``descriptor``'s number, borrowed for a system call while this object lives.
    package var fd: Int32 { descriptor.rawValue }
    package let relativePath: String
    /// This mapping's slot in the mapping guard (``MappingGuard``), -1 when not guarded.
    @exclusivity(unchecked) private var guardSlot: Int32 = -1
    /// The guard's repair count of ``guardSlot`` at the last ``cutShortSinceLastCheck()``.
    @exclusivity(unchecked) private var repairsChecked: UInt64 = 0
    /// A repair in a slot given up by ``remap(size:)`` before anyone checked it.
    @exclusivity(unchecked) private var repairCarried = false

    /// Opens (creating when asked) and maps `.baton/<relativePath>`. When the file is smaller
    /// than `minimumSize`, it is extended with zeros first, its blocks reserved
    /// (``FileSpace``): a full disk throws `noSpace` here instead of a `SIGBUS` on a later write
    /// through the mapping.
    package convenience init(_ container: SharedContainer, relativePath: String, minimumSize: Int, create: Bool = true) throws {
        try self.init(container.files, relativePath: relativePath, minimumSize: minimumSize, create: create)
    }

    /// ``init(_:relativePath:minimumSize:create:)`` through the container's files (for a part
    /// that holds those rather than the container).
    package init(_ files: ContainerFiles, relativePath: String, minimumSize: Int, create: Bool = true) throws {
        // A throw before it is stored closes the descriptor.
        let descriptor = try files.openDescriptor(relativePath, flags: O_RDWR | (create ? O_CREAT : 0))
        let fd = descriptor.rawValue
        var size = Int(try Sys.fstat(fd).get("checking \(relativePath)").st_size)
        if size < minimumSize {
            try FileSpace.reserve(fd, from: size, to: minimumSize, path: relativePath)
            size = minimumSize
        }
        self.pointer = try Sys.mmap(fd, size: size, writable: true).get("mapping \(relativePath)")
        self.size = size
        self.descriptor = descriptor
        self.relativePath = relativePath
        guardSlot = MappingGuard.register(pointer, size: size, fd: fd)
    }

    /// Maps the file again at `size` bytes (extending the file, its blocks reserved, when it is
    /// shorter). - Throws: `noSpace` when the disk is full (the mapping is left as it was).
    package func remap(size newSize: Int) throws {
        let current = Int(try Sys.fstat(fd).get("checking \(relativePath)").st_size)
        if current < newSize {
            try FileSpace.reserve(fd, from: current, to: newSize, path: relativePath)
        }
        let newPointer = try Sys.mmap(fd, size: max(newSize, current), writable: true).get("mapping \(relativePath)")
        if hasUncheckedRepair { repairCarried = true }
        MappingGuard.unregister(guardSlot)
        Sys.munmap(pointer, size: size)
        pointer = newPointer
        size = max(newSize, current)
        guardSlot = MappingGuard.register(pointer, size: size, fd: fd)
        repairsChecked = 0
    }

    /// Whether another program cut the file short since the last call, so that the owner
    /// rebuilds or reports what it held. Call under the owner's lock, as ``remap(size:)``.
    ///
    /// - Guarded mapping (``MappingGuard``): one load, no system call. A cut is seen once a touch
    ///   of the mapping past the new end faulted and the guard extended the file again (zeros),
    ///   so nothing faults after it; a cut that no touch reached yet harms nothing until one does.
    ///   Check after touching the mapping (``hasUncheckedRepair``), not only before.
    /// - Unguarded (the guard's table was full): one `fstat`, `true` while the file is shorter
    ///   than the mapping; nothing may touch the mapping then (it would raise `SIGBUS`).
    package func cutShortSinceLastCheck() -> Bool {
        guard guardSlot >= 0 else {
            guard case .success(let info) = Sys.fstat(fd) else { return false }
            return Int(info.st_size) < size
        }
        let repairs = MappingGuard.repairs(in: guardSlot)
        defer { (repairsChecked, repairCarried) = (repairs, false) }
        return repairs != repairsChecked || repairCarried
    }

    /// Whether the mapping guard (``MappingGuard``) covers this mapping (it does unless its table
    /// of 1,024 mappings was full): a touch past the end of the file then reads zeros instead
    /// of raising `SIGBUS`.
    package var isGuarded: Bool { guardSlot >= 0 }

    /// Whether the guard repaired a fault in this mapping that ``cutShortSinceLastCheck()`` has
    /// not reported yet: one load, never a system call (`false` when unguarded, where a touch
    /// past the end would have raised `SIGBUS` instead).
    package var hasUncheckedRepair: Bool {
        guard guardSlot >= 0 else { return false }
        return MappingGuard.repairs(in: guardSlot) != repairsChecked || repairCarried
    }

    /// The file's current size on disk (another process may have grown it).
    package func fileSize() throws -> Int {
        Int(try Sys.fstat(fd).get("checking \(relativePath)").st_size)
    }

    /// Extends the file again (zeros, blocks reserved) when another program cut it shorter than
    /// the mapping: touching the mapping past the file's end would fault (SIGBUS). One `fstat`.
    /// Baton never shrinks a mapped file, so the lost part was damage: it reads as zeros, which
    /// the owner's own checks then see.
    /// - Returns: Whether the file had been cut short.
    /// - Throws: `noSpace` when the disk is full, file errors.
    @discardableResult
    package func restoreTruncatedSize() throws -> Bool {
        try Self.restoreTruncatedSize(fd, to: size, path: relativePath)
    }

    /// ``restoreTruncatedSize()`` for a file mapped some other way: extends `fd` to `size` bytes
    /// when it is shorter.
    @discardableResult
    package static func restoreTruncatedSize(_ fd: Int32, to size: Int, path: String) throws -> Bool {
        let current = Int(try Sys.fstat(fd).get("checking \(path)").st_size)
        guard current < size else { return false }
        try FileSpace.reserve(fd, from: current, to: size, path: path)
        return true
    }

    /// Flushes the mapping to disk.
    package func sync() throws {
        try DurableSync.sync(mapping: pointer, size: size, of: fd).get("syncing \(relativePath)")
    }

    deinit {
        MappingGuard.unregister(guardSlot)
        Sys.munmap(pointer, size: size)
        // `descriptor` closes itself after this.
    }
}
