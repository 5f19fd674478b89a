#if canImport(Darwin)
import CBatonShims
import Dispatch
import Synchronization

/// Apple-platform stand-in for inotify. kqueue reports no close events, so subscribers are
/// woken on a short timer and re-check (lock waits, presence lists). NOT TESTED on Linux CI.
final class FileEvents: Sendable {
    static let shared = FileEvents()
    static let lockEvents: UInt32 = 1
    static let directoryEvents: UInt32 = 2
    private init() {}

    final class Subscription: Sendable {
        let events = EventCounter()
        private let timer: DispatchSourceTimer
        fileprivate init() {
            timer = DispatchSource.makeTimerSource(queue: .global())
            timer.schedule(deadline: .now() + .milliseconds(25), repeating: .milliseconds(25))
            timer.setEventHandler { [events] in events.notify() }
            timer.resume()
        }
        deinit { timer.cancel() }
    }

    func subscribe(path: String, mask: UInt32) throws -> Subscription { Subscription() }
}
#endif
