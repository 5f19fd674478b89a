#if os(Linux)
import CBatonShims

extension BootIdentity {
    /// The boot id's text (`/proc/sys/kernel/random/boot_id`, 36 bytes of ASCII), or empty when
    /// it cannot be read.
    package static let bytes: [UInt8] = {
        guard case .success(let bytes) = Sys.readFile(AT_FDCWD, "/proc/sys/kernel/random/boot_id", limit: 64) else { return [] }
        return Array(bytes.prefix { $0 != UInt8(ascii: "\n") })
    }()
}
#endif
