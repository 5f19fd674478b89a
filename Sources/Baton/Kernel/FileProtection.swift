/// The data-protection class of the files Baton creates (Apple platforms; ignored on Linux).
///
/// iOS encrypts files with per-class keys. A notification service extension often runs while
/// the device is locked, and can open only files whose class allows it: Baton's default,
/// ``completeUntilFirstUserAuthentication``, is readable from the first unlock after boot until
/// shutdown, locked or not. ``complete`` files cannot be opened while the device is locked, so
/// an extension woken on a locked phone would fail with `EPERM`.
///
/// Applied with `fcntl(F_SETPROTECTIONCLASS)` when Baton creates a file. The directory Baton
/// creates and the files of a `SharedDatabase` (SQLite creates them) take the container's
/// default class: set it for the App Group container with `FileManager` if you need another.
public enum FileProtection: Sendable, Hashable {
    /// Class A (`FileProtectionType.complete`): unreadable while the device is locked.
    case complete
    /// Class B (`FileProtectionType.completeUnlessOpen`): files open when the device locks stay
    /// usable; new opens fail while locked.
    case completeUnlessOpen
    /// Class C (`FileProtectionType.completeUntilFirstUserAuthentication`): readable after the
    /// first unlock since boot. The default.
    case completeUntilFirstUserAuthentication
    /// Class D (`FileProtectionType.none`): always readable.
    case none
}
