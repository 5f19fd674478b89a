#if canImport(Darwin)
import Darwin

/// Identifies the current boot (`kern.bootsessionuuid`). Apple-only, NOT TESTED on Linux CI.
enum BootSession {
    static let current: UInt64 = {
        var size = 0
        guard sysctlbyname("kern.bootsessionuuid", nil, &size, nil, 0) == 0, size > 0 else { return 0 }
        var buffer = [UInt8](repeating: 0, count: size)
        guard sysctlbyname("kern.bootsessionuuid", &buffer, &size, nil, 0) == 0 else { return 0 }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in buffer.prefix(size) where byte != 0 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return hash == 0 ? 1 : hash
    }()
}
#endif
