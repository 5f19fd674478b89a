#if canImport(Darwin)
import Darwin

extension ChildSpawn {
    /// Every descriptor not named in the file actions is closed in the child.
    static let platformFlags = Int16(POSIX_SPAWN_CLOEXEC_DEFAULT)

    /// Apple's spawn types are opaque pointers (`void *`), allocated by the `_init` calls.
    typealias FileActions = posix_spawn_file_actions_t?
    typealias Attributes = posix_spawnattr_t?
    static func emptyFileActions() -> FileActions { nil }
    static func emptyAttributes() -> Attributes { nil }

    /// Keeps descriptors below `fd` (the standard streams and the extra ones), which
    /// `POSIX_SPAWN_CLOEXEC_DEFAULT` would close too.
    static func closeFrom(_ actions: inout FileActions, _ fd: Int32) {
        for descriptor in 0..<fd { posix_spawn_file_actions_addinherit_np(&actions, descriptor) }
    }
}
#endif
