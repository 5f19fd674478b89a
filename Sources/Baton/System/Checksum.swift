import CBatonShims

/// CRC-32C, hardware-accelerated where the CPU has it.
package enum Checksum {
    package static func crc32c(_ buffer: UnsafeRawBufferPointer, seed: UInt32 = 0) -> UInt32 {
        guard let base = buffer.baseAddress, buffer.count > 0 else { return seed }
        return baton_crc32c(seed, base, buffer.count)
    }

    package static func crc32c(_ bytes: some Sequence<UInt8>, seed: UInt32 = 0) -> UInt32 {
        let array = Array(bytes)
        return array.withUnsafeBytes { crc32c($0, seed: seed) }
    }
}
