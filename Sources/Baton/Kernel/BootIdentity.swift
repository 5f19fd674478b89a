/// Identifies the current boot of the machine, so that state kept in shared memory by processes
/// of an earlier boot (an epoch not yet synced before a power loss, a lock word whose owner
/// cannot exist any more) is recognised: `/proc/sys/kernel/random/boot_id` on Linux
/// (`BootIdentity+Linux.swift`), `kern.bootsessionuuid` on Apple platforms
/// (`BootIdentity+Darwin.swift`).
package enum BootIdentity {
    /// A 64-bit hash of ``bytes`` (never 0; 1 when the identity could not be read).
    package static let hash: UInt64 = FNV1a.hash(bytes)
}

/// FNV-1a, 64 bits: a short, stable hash for names and identities (not cryptographic). Never 0.
package enum FNV1a {
    package static func hash(_ bytes: some Sequence<UInt8>) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes { hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01b3 }
        return hash == 0 ? 1 : hash
    }
}
