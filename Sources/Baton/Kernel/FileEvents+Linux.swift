#if os(Linux)
import CBatonShims
import Synchronization

/// File-system events from inotify, read on one kernel-wait thread per process.
///
/// A subscriber gets an ``EventCounter`` that moves whenever something it is interested in
/// happens (see ``FileInterest``), and optionally a callback run on the event thread.
///
/// Linux posts the close event of a file *before* it removes the closing process's `flock` on it
/// (`__fput` in fs/file_table.c calls `fsnotify_close` before `locks_remove_file`). A waiter woken
/// by the event can still find the lock held for a moment, so every close event is delivered
/// again ``redeliveryDelays`` later: a waiter never sleeps through a release because it looked
/// too early. (Apple's `NOTE_FUNLOCK` is posted after the release: no such delay there.)
package final class FileEvents: Sendable {
    package static let shared = FileEvents()

    /// When a close event is delivered again after the first delivery.
    package static let redeliveryDelays: [Duration] = [.microseconds(500), .milliseconds(2), .milliseconds(10), .milliseconds(50)]

    private static func mask(_ interest: FileInterest) -> UInt32 {
        switch interest {
        case .lockReleased: UInt32(IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ATTRIB)
        case .writerGone: UInt32(IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF)
        case .directoryChanged:
            UInt32(IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF)
        case .writerGoneInDirectory: UInt32(IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_DELETE_SELF)
        }
    }

    private struct Subscriber {
        var counter: EventCounter
        var mask: UInt32
        var callback: (@Sendable () -> Void)?
    }

    private struct State {
        var fd: Int32 = -1
        var started = false
        var nextID: UInt64 = 0
        var watches: [Int32: [UInt64: Subscriber]] = [:]
    }

    private let state = Mutex(State())

    private init() {}

    /// A live subscription; it stops when released (deinit).
    package final class Subscription: Sendable {
        package let events: EventCounter
        private let id: UInt64
        private let wd: Int32
        private let owner: FileEvents

        fileprivate init(events: EventCounter, id: UInt64, wd: Int32, owner: FileEvents) {
            self.events = events
            self.id = id
            self.wd = wd
            self.owner = owner
        }

        deinit { owner.unsubscribe(wd: wd, id: id) }
    }

    /// Subscribes to events on `path` (absolute). `callback`, when given, runs on the event
    /// thread after the counter moved: keep it short (ring a shared word, never block).
    package func subscribe(path: String, interest: FileInterest, callback: (@Sendable () -> Void)? = nil) throws -> Subscription {
        let events = EventCounter()
        let mask = Self.mask(interest)
        let (wd, id) = try state.withLock { state throws -> (Int32, UInt64) in
            if state.fd < 0 {
                state.fd = try Sys.retrying("inotify_init1") { inotify_init1(Int32(IN_CLOEXEC)) }
                    .get("starting file-event monitoring (inotify)")
            }
            let wd = try Sys.retrying("inotify_add_watch") {
                inotify_add_watch(state.fd, path, mask | UInt32(IN_MASK_ADD))
            }.get("watching \(path)")
            state.nextID &+= 1
            state.watches[wd, default: [:]][state.nextID] = Subscriber(counter: events, mask: mask, callback: callback)
            if !state.started {
                state.started = true
                let fd = state.fd
                KernelThread.spawn(name: "baton-inotify") { [self] in self.run(fd: fd) }
            }
            return (wd, state.nextID)
        }
        return Subscription(events: events, id: id, wd: wd, owner: self)
    }

    private func unsubscribe(wd: Int32, id: UInt64) {
        state.withLock { state in
            guard var subscribers = state.watches[wd] else { return }
            subscribers[id] = nil
            if subscribers.isEmpty {
                state.watches[wd] = nil
                _ = inotify_rm_watch(state.fd, wd)
            } else {
                state.watches[wd] = subscribers
                // The kernel's mask stays the union of every subscriber's (IN_MASK_ADD only
                // widens it): the extra events are filtered out in `run`.
            }
        }
    }

    private func run(fd: Int32) {
        let capacity = 64 * 1024
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 8)
        defer { buffer.deallocate() }
        let closeMask = UInt32(IN_CLOSE_WRITE | IN_CLOSE_NOWRITE)
        while true {
            let count = read(fd, buffer, capacity)
            if count <= 0 {
                if count < 0 && errno == EINTR { continue }
                return
            }
            var touched: [Subscriber] = []
            var closed: [Subscriber] = []
            var offset = 0
            state.withLock { state in
                var overflow = false
                while offset + MemoryLayout<inotify_event>.size <= count {
                    let event = buffer.load(fromByteOffset: offset, as: inotify_event.self)
                    offset += MemoryLayout<inotify_event>.size + Int(event.len)
                    if event.mask & UInt32(IN_Q_OVERFLOW) != 0 { overflow = true; continue }
                    let gone = event.mask & UInt32(IN_IGNORED) != 0
                    if let subscribers = state.watches[event.wd] {
                        for subscriber in subscribers.values where gone || subscriber.mask & event.mask != 0 {
                            touched.append(subscriber)
                            if event.mask & closeMask != 0 { closed.append(subscriber) }
                        }
                    }
                    // The watched inode is gone; subscribers re-check and subscribe again.
                    if gone { state.watches[event.wd] = nil }
                }
                if overflow {
                    touched = state.watches.values.flatMap { $0.values }
                    closed = touched
                }
            }
            Self.deliver(touched)
            if !closed.isEmpty {
                let again = closed
                for delay in Self.redeliveryDelays {
                    _ = DeadlineTimer.shared.schedule(at: .now + delay) { Self.deliver(again) }
                }
            }
        }
    }

    private static func deliver(_ subscribers: [Subscriber]) {
        var seen = Set<ObjectIdentifier>()
        for subscriber in subscribers where seen.insert(ObjectIdentifier(subscriber.counter)).inserted {
            subscriber.counter.notify()
            subscriber.callback?()
        }
    }
}
#endif
