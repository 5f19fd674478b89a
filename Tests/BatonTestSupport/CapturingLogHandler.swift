import Logging
import Synchronization

/// A log handler that keeps every message, for assertions.
package struct CapturingLogHandler: LogHandler {
    package final class Store: Sendable {
        package let entries = Mutex<[(level: Logger.Level, message: String, event: String?)]>([])
        package var events: [String] { entries.withLock { $0.compactMap(\.event) } }
        package var messages: [String] { entries.withLock { $0.map(\.message) } }
    }
    let store: Store
    package var metadata: Logger.Metadata = [:]
    package var logLevel: Logger.Level = .trace

    package subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    package func log(event: LogEvent) {
        let recorded = (level: event.level, message: "\(event.message)", event: event.metadata?["baton.event"].map { "\($0)" })
        store.entries.withLock { $0.append(recorded) }
    }

    package static func logger() -> (Logger, Store) {
        let store = Store()
        return (Logger(label: "test") { _ in CapturingLogHandler(store: store) }, store)
    }
}
