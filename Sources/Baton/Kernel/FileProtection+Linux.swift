#if os(Linux)
extension FileProtection {
    /// Linux has no per-file protection classes: nothing to do.
    func apply(to fd: Int32) -> Int32 { 0 }
}
#endif
