import CBatonShims

/// Keeps a shared mapping usable when another program cuts its file short.
///
/// Touching a `MAP_SHARED` page past the end of its file raises `SIGBUS` (POSIX `mmap`), on
/// Linux and Apple platforms alike; Baton never shrinks a mapped file, so such a fault is damage
/// done from outside (`truncate` by another program). A mapping registered here is repaired in
/// the fault handler (`mapping_guard.c`): its file is extended back to the mapping's length with
/// zeros, and the access runs again. The zeros are then seen by the owner's own checks
/// (checksums, header words), which report the loss or rebuild, as for any other damage. A fault
/// the guard does not repair goes to the handler installed before, or kills the process as it
/// would have.
///
/// The same code runs on both kernels: `sigaction`, `fstat` and `ftruncate` are POSIX.
package enum MappingGuard {
    /// Registers `pointer ..< pointer + size`, a mapping of `fd` from offset 0; returns the slot
    /// to ``unregister(_:)`` before the mapping or the descriptor goes away (-1: not guarded,
    /// when the table of 1,024 mappings is full).
    static func register(_ pointer: UnsafeMutableRawPointer, size: Int, fd: Int32) -> Int32 {
        baton_mapping_guard_register(pointer, size, fd)
    }

    /// ``register(_:size:fd:)`` for a mapping of `fd` from file offset `offset`.
    static func register(_ pointer: UnsafeMutableRawPointer, size: Int, fd: Int32, offset: Int) -> Int32 {
        baton_mapping_guard_register_at(pointer, size, fd, Int64(offset))
    }

    /// How many faults the guard repaired in `slot` since it was registered (0 for a negative
    /// slot): an owner that remembers the count learns, with one load and no system call, that
    /// its file was cut short since.
    static func repairs(in slot: Int32) -> UInt64 {
        baton_mapping_guard_slot_repairs(slot)
    }

    /// Forgets a registration (a negative slot is ignored).
    static func unregister(_ slot: Int32) {
        baton_mapping_guard_unregister(slot)
    }

    /// How many faults the guard repaired in this process (for diagnostics and tests).
    package static var repairs: UInt64 { baton_mapping_guard_repairs() }
}
