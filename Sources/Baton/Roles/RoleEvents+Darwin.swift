#if canImport(Darwin)
extension FileEvents {
    /// Darwin's stand-in wakes subscribers on a timer whatever the mask. NOT TESTED on Linux CI.
    static let roleDirectoryEvents: UInt32 = directoryEvents
}
#endif
