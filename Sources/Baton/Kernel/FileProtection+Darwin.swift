#if canImport(Darwin)
import CBatonShims
import Darwin

extension FileProtection {
    /// The class numbers xnu uses (bsd/sys/content_protection.h, a private header:
    /// PROTECTION_CLASS_A = 1, B = 2, C = 3, D = 4), which `F_SETPROTECTIONCLASS` takes.
    /// A to D map to complete, completeUnlessOpen, completeUntilFirstUserAuthentication and none
    /// (Apple Platform Security, "Data Protection classes").
    var protectionClass: Int32 {
        switch self {
        case .complete: 1
        case .completeUnlessOpen: 2
        case .completeUntilFirstUserAuthentication: 3
        case .none: 4
        }
    }

    /// Sets the class of a file Baton just created. File systems without data protection
    /// (macOS volumes, some external disks) refuse with ENOTSUP or EINVAL: nothing to protect.
    /// - Returns: 0, or the errno of a real failure.
    func apply(to fd: Int32) -> Int32 {
        // F_SETPROTECTIONCLASS = 64, xnu bsd/sys/fcntl.h.
        if baton_fcntl_int(fd, F_SETPROTECTIONCLASS, protectionClass) == 0 { return 0 }
        let code = errno
        return code == ENOTSUP || code == EINVAL ? 0 : code
    }
}
#endif
