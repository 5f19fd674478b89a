#if !canImport(Darwin)
/// File coordination: Apple platforms wrap opening in `NSFileCoordinator`; elsewhere the
/// container's open lock is all the coordination there is.
enum FileCoordination {
    static func coordinate<T>(writingItemAt path: String, _ body: () throws -> T) throws -> T {
        try body()
    }

    static func coordinate<T>(readingItemAt path: String, _ body: () throws -> T) throws -> T {
        try body()
    }
}
#endif
