#if canImport(Darwin)
import Foundation

/// Wraps opening in `NSFileCoordinator`, as GRDB's guide on sharing a database recommends, on
/// top of the container's open lock. Apple-only and untested here (Linux has no file
/// coordination); kept thin on purpose.
enum FileCoordination {
    static func coordinate<T>(writingItemAt path: String, _ body: () throws -> T) throws -> T {
        try run(path, writing: true, body)
    }

    static func coordinate<T>(readingItemAt path: String, _ body: () throws -> T) throws -> T {
        try run(path, writing: false, body)
    }

    private static func run<T>(_ path: String, writing: Bool, _ body: () throws -> T) throws -> T {
        let coordinator = NSFileCoordinator(filePresenter: nil)
        let url = URL(fileURLWithPath: path)
        var coordinatorError: NSError?
        var result: Result<T, any Error>?
        if writing {
            coordinator.coordinate(writingItemAt: url, options: .forMerging, error: &coordinatorError) { _ in
                result = Result { try body() }
            }
        } else {
            coordinator.coordinate(readingItemAt: url, options: .withoutChanges, error: &coordinatorError) { _ in
                result = Result { try body() }
            }
        }
        if let coordinatorError { throw coordinatorError }
        guard let result else { throw CocoaError(.fileReadUnknown) }
        return try result.get()
    }
}
#endif
