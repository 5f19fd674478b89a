/// Identifies the current boot of the machine, so that state kept in shared memory by processes
/// of an earlier boot (an epoch not yet synced before a power loss, a lock word whose owner
/// cannot exist any more) is recognised, from the kernel's own per-boot identifier (read in
/// `BootIdentity+Linux.swift` and `BootIdentity+Darwin.swift`).
package enum BootIdentity {
    /// A 64-bit ``FNV1a`` hash of ``bytes`` (never 0: a record's 0 means "no boot recorded").
    package static let hash: UInt64 = {
        let hash = FNV1a.hash(bytes)
        return hash == 0 ? 1 : hash
    }()
}
