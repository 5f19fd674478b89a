import Foundation
import GRDBSQLite
import Synchronization

/// An SQLite VFS that is the default one (`unix` here) with every `xSync` made `delay` longer:
/// a disk busy with other processes' writes, for the connections opened with it (by name:
/// registering it does not make it the default, so other tests' connections never use it).
///
/// Each file keeps the default VFS's own file object and methods, except that `pMethods`
/// points to a copy of them whose `xSync` sleeps first, then calls the original (one copy per
/// set of methods: the default VFS opens a database with locking methods, its WAL and
/// journals without).
enum SlowSyncVFS {
    static let name = "baton-test-slow-sync"

    /// How long each sync waits before it syncs, in microseconds.
    static let delay = Atomic<Int>(0)

    /// Syncs that waited (of every connection opened with this VFS).
    static let slowedSyncs = Atomic<Int>(0)

    /// Addresses of methods, as keys (the pointers themselves are not `Sendable`).
    private typealias Address = UInt

    private struct State {
        /// The default VFS.
        var base: Address = 0
        /// The slow copy of each set of methods seen, and the original of each copy.
        var copies: [Address: Address] = [:]
        var originals: [Address: Address] = [:]
    }

    private static let state = Mutex(State())

    /// Registers the VFS once, with `delayMicroseconds` per sync; `false` when SQLite has no
    /// default VFS or refuses the registration.
    @discardableResult
    static func register(delayMicroseconds: Int) -> Bool {
        delay.store(delayMicroseconds, ordering: .relaxed)
        return state.withLock { state -> Bool in
            if state.base != 0 { return true }
            guard let found = sqlite3_vfs_find(nil) else { return false }
            state.base = Address(bitPattern: found)
            let vfs = UnsafeMutablePointer<sqlite3_vfs>.allocate(capacity: 1)
            vfs.initialize(to: found.pointee)
            vfs.pointee.pNext = nil
            vfs.pointee.zName = UnsafePointer(strdup(name))
            vfs.pointee.xOpen = { _, path, file, flags, outFlags in
                guard let base = UnsafeMutablePointer<sqlite3_vfs>(bitPattern: SlowSyncVFS.state.withLock { $0.base }), let file else {
                    return SQLITE_ERROR
                }
                let code = base.pointee.xOpen(base, path, file, flags, outFlags)
                if code == SQLITE_OK, let original = file.pointee.pMethods {
                    file.pointee.pMethods = UnsafePointer(SlowSyncVFS.slowCopy(of: original))
                }
                return code
            }
            let registered = sqlite3_vfs_register(vfs, 0) == SQLITE_OK
            if !registered { state.base = 0 }
            return registered
        }
    }

    /// The methods of `original` with a slow `xSync` (made once per `original`).
    private static func slowCopy(of original: UnsafePointer<sqlite3_io_methods>) -> UnsafeMutablePointer<sqlite3_io_methods> {
        let address = state.withLock { state -> Address in
            if let copy = state.copies[Address(bitPattern: original)] { return copy }
            let copy = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
            copy.initialize(to: original.pointee)
            copy.pointee.xSync = { file, flags in
                guard let methods = file?.pointee.pMethods,
                      let address = SlowSyncVFS.state.withLock({ $0.originals[Address(bitPattern: methods)] }),
                      let original = UnsafePointer<sqlite3_io_methods>(bitPattern: address) else { return SQLITE_ERROR }
                SlowSyncVFS.slowedSyncs.add(1, ordering: .relaxed)
                usleep(useconds_t(SlowSyncVFS.delay.load(ordering: .relaxed)))
                return original.pointee.xSync(file, flags)
            }
            state.copies[Address(bitPattern: original)] = Address(bitPattern: copy)
            state.originals[Address(bitPattern: copy)] = Address(bitPattern: original)
            return Address(bitPattern: copy)
        }
        return UnsafeMutablePointer(bitPattern: address)!
    }
}
