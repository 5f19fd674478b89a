/// FNV-1a, 64 bits: a short, stable hash for names and identities (not cryptographic). The one
/// copy in the package: signal-table slots, long defaults signal names, database identifiers
/// and the boot identity all hash with it, and those values are stored in shared files, so the
/// function must never change.
package enum FNV1a {
    package static let offsetBasis: UInt64 = 0xcbf2_9ce4_8422_2325
    package static let prime: UInt64 = 0x0000_0100_0000_01b3

    /// The hash of `bytes` (0 is possible, if unlikely).
    package static func hash(_ bytes: some Sequence<UInt8>) -> UInt64 {
        var hash = offsetBasis
        for byte in bytes { hash = (hash ^ UInt64(byte)) &* prime }
        return hash
    }

    /// The hash of a string's UTF-8 bytes.
    package static func hash(_ text: String) -> UInt64 { hash(text.utf8) }
}
