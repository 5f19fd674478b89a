#if canImport(Glibc)
import Glibc

extension ChildSpawn {
    static let platformFlags: Int16 = 0

    /// glibc's spawn types are structs, initialised by the `_init` calls.
    typealias FileActions = posix_spawn_file_actions_t
    typealias Attributes = posix_spawnattr_t
    static func emptyFileActions() -> FileActions { posix_spawn_file_actions_t() }
    static func emptyAttributes() -> Attributes { posix_spawnattr_t() }

    private typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    /// `posix_spawn_file_actions_addclosefrom_np` (glibc 2.34+), looked up at run time because
    /// the Glibc module does not export GNU extensions.
    private static let closeFromFunction: CloseFrom? = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: CloseFrom.self)
    }()

    /// Closes every descriptor from `fd` up in the child: one a library opened without
    /// close-on-exec must not leak into it (a dead core's socket would stay open).
    static func closeFrom(_ actions: inout posix_spawn_file_actions_t, _ fd: Int32) {
        _ = closeFromFunction?(&actions, fd)
    }
}
#endif
