#if canImport(Darwin)
import Darwin

extension ChildSpawn {
    /// Every descriptor not named in the file actions is closed in the child.
    static let platformFlags = Int16(POSIX_SPAWN_CLOEXEC_DEFAULT)

    /// Keeps descriptors below `fd` (the standard streams and the extra ones), which
    /// `POSIX_SPAWN_CLOEXEC_DEFAULT` would close too.
    static func closeFrom(_ actions: inout posix_spawn_file_actions_t, _ fd: Int32) {
        for descriptor in 0..<fd { posix_spawn_file_actions_addinherit_np(&actions, descriptor) }
    }
}
#endif
