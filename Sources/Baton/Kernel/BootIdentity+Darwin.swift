#if canImport(Darwin)
import CBatonShims

extension BootIdentity {
    /// `kern.bootsessionuuid` (a UUID string), or empty when it cannot be read.
    package static let bytes: [UInt8] = {
        var buffer = [CChar](repeating: 0, count: 64)
        var length = buffer.count
        guard baton_darwin_boot_session(&buffer, &length) == 0 else { return [] }
        return buffer.prefix(length).prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
    }()
}
#endif
