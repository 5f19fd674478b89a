#if os(Linux)
import CBatonShims

/// Identifies the current boot, so an epoch counter can tell that the machine restarted (and
/// that writes not yet synced before a power loss may be missing).
enum BootSession {
    /// A hash of `/proc/sys/kernel/random/boot_id`; 0 when it cannot be read.
    static let current: UInt64 = {
        guard case .success(let bytes) = Sys.readFile(AT_FDCWD, "/proc/sys/kernel/random/boot_id", limit: 128) else { return 0 }
        return fnv1a(bytes)
    }()

    static func fnv1a(_ bytes: [UInt8]) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return hash == 0 ? 1 : hash
    }
}
#endif
