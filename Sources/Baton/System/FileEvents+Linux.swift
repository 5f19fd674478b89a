#if os(Linux)
import CBatonShims
import Synchronization

/// File-system events from inotify, read on one kernel-wait thread per process.
///
/// A subscriber gets an ``EventCounter`` that moves whenever the watched file (or, for a
/// directory, anything inside it) is closed, created, deleted or renamed. Baton releases a
/// lock by closing its descriptor and the kernel closes the descriptors of a process that
/// dies, so a close event is the kernel's way of saying "a lock may have been released".
final class FileEvents: Sendable {
    static let shared = FileEvents()

    /// What a subscription listens for.
    static let lockEvents: UInt32 = UInt32(IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ATTRIB)
    static let directoryEvents: UInt32 = UInt32(
        IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF)

    private struct Watch {
        var mask: UInt32
        var subscribers: [UInt64: EventCounter]
    }

    private struct State {
        var fd: Int32 = -1
        var started = false
        var nextID: UInt64 = 0
        var watches: [Int32: Watch] = [:]
    }

    private let state = Mutex(State())

    private init() {}

    /// A live subscription; cancel it (or let it deinit) to stop watching.
    final class Subscription: Sendable {
        let events: EventCounter
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

    /// Subscribes to events on `path` (absolute).
    func subscribe(path: String, mask: UInt32) throws -> Subscription {
        let events = EventCounter()
        let (wd, id) = try state.withLock { state throws -> (Int32, UInt64) in
            if state.fd < 0 {
                state.fd = try Sys.retrying("inotify_init1") { inotify_init1(Int32(IN_CLOEXEC)) }
                    .get("starting file-event monitoring (inotify)")
            }
            let wd = try Sys.retrying("inotify_add_watch") {
                inotify_add_watch(state.fd, path, mask | UInt32(IN_MASK_ADD))
            }.get("watching \(path)")
            state.nextID &+= 1
            state.watches[wd, default: Watch(mask: 0, subscribers: [:])].mask |= mask
            state.watches[wd]!.subscribers[state.nextID] = events
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
            guard var watch = state.watches[wd] else { return }
            watch.subscribers[id] = nil
            if watch.subscribers.isEmpty {
                state.watches[wd] = nil
                _ = inotify_rm_watch(state.fd, wd)
            } else {
                state.watches[wd] = watch
            }
        }
    }

    private func run(fd: Int32) {
        let capacity = 64 * 1024
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 8)
        defer { buffer.deallocate() }
        while true {
            let count = read(fd, buffer, capacity)
            if count <= 0 {
                if count < 0 && errno == EINTR { continue }
                return
            }
            var touched: [EventCounter] = []
            var offset = 0
            var overflow = false
            state.withLock { state in
                while offset + MemoryLayout<inotify_event>.size <= count {
                    let event = buffer.load(fromByteOffset: offset, as: inotify_event.self)
                    offset += MemoryLayout<inotify_event>.size + Int(event.len)
                    if event.mask & UInt32(IN_Q_OVERFLOW) != 0 { overflow = true; continue }
                    if let watch = state.watches[event.wd] {
                        touched.append(contentsOf: watch.subscribers.values)
                    }
                    if event.mask & UInt32(IN_IGNORED) != 0 {
                        // The watched inode is gone; subscribers re-check and re-subscribe.
                        state.watches[event.wd] = nil
                    }
                }
                if overflow {
                    touched = state.watches.values.flatMap { $0.subscribers.values }
                }
            }
            var seen = Set<ObjectIdentifier>()
            for counter in touched where seen.insert(ObjectIdentifier(counter)).inserted {
                counter.notify()
            }
        }
    }
}
#endif
