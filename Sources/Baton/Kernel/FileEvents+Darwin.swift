#if canImport(Darwin)
import CBatonShims
import Synchronization

/// File-system events from kqueue (`EVFILT_VNODE`), read on one kernel-wait thread per process.
///
/// The same contract as the Linux implementation (see ``FileInterest``): a file watch reports
/// `NOTE_FUNLOCK` (posted by the kernel after a `flock` on the file is released by `flock(2)`,
/// by the last close of its open file, or by its holder's death), removal and renaming. kqueue
/// reports nothing about the files inside a watched directory, so a directory watch also watches
/// each of its files (opened `O_EVTONLY`), and follows the directory's `NOTE_WRITE` to watch new
/// entries and forget removed ones. No timer, no polling. TYPE-CHECKED ONLY on Linux CI.
package final class FileEvents: Sendable {
    package static let shared = FileEvents()

    private struct Subscriber {
        var counter: EventCounter
        var callback: (@Sendable () -> Void)?
    }

    /// One watched path: a file, or a directory with its entries.
    private struct Watch {
        var fd: Int32
        var tag: UInt64
        var isDirectory: Bool
        var subscribers: [UInt64: Subscriber] = [:]
        /// A directory's entries: name → (descriptor, tag).
        var entries: [String: (fd: Int32, tag: UInt64)] = [:]
    }

    private struct State {
        var kq: Int32 = -1
        var started = false
        var nextID: UInt64 = 0
        var watches: [String: Watch] = [:]
        /// kevent tag → the watched path it reports for.
        var tags: [UInt64: String] = [:]
    }

    private let state = Mutex(State())

    private init() {}

    /// A live subscription; it stops when released (deinit).
    package final class Subscription: Sendable {
        package let events: EventCounter
        private let id: UInt64
        private let path: String
        private let owner: FileEvents

        fileprivate init(events: EventCounter, id: UInt64, path: String, owner: FileEvents) {
            self.events = events
            self.id = id
            self.path = path
            self.owner = owner
        }

        deinit { owner.unsubscribe(path: path, id: id) }
    }

    /// Subscribes to events on `path` (absolute). `callback`, when given, runs on the event
    /// thread after the counter moved: keep it short.
    package func subscribe(path: String, interest: FileInterest, callback: (@Sendable () -> Void)? = nil) throws -> Subscription {
        let events = EventCounter()
        let isDirectory = interest == .directoryChanged || interest == .writerGoneInDirectory
        let id = try state.withLock { state throws -> UInt64 in
            if state.kq < 0 {
                state.kq = try Sys.retrying("kqueue") { kqueue() }.get("starting file-event monitoring (kqueue)")
                _ = baton_fcntl_int(state.kq, F_SETFD, FD_CLOEXEC)
            }
            if state.watches[path] == nil {
                state.watches[path] = try Self.watch(&state, path: path, isDirectory: isDirectory)
            }
            state.nextID &+= 1
            state.watches[path]!.subscribers[state.nextID] = Subscriber(counter: events, callback: callback)
            if !state.started {
                state.started = true
                let kq = state.kq
                KernelThread.spawn(name: "baton-kqueue") { [self] in self.run(kq: kq) }
            }
            return state.nextID
        }
        return Subscription(events: events, id: id, path: path, owner: self)
    }

    private static func register(_ state: inout State, path: String, fflags: UInt32, reportingFor watched: String) throws -> (fd: Int32, tag: UInt64) {
        let fd = try Sys.retrying("open(O_EVTONLY)") { baton_darwin_open_event_only(path) }.get("watching \(path)")
        state.nextID &+= 1
        let tag = state.nextID
        if baton_darwin_watch_vnode(state.kq, fd, fflags, tag, 0) != 0 {
            let error = SystemCallError(call: "kevent(EV_ADD)", errno: baton_errno())
            Sys.close(fd)
            throw BatonError.system(error, "watching \(path)")
        }
        state.tags[tag] = watched
        return (fd, tag)
    }

    private static func watch(_ state: inout State, path: String, isDirectory: Bool) throws -> Watch {
        let fflags = isDirectory ? baton_darwin_directory_events() : baton_darwin_lock_release_events()
        let (fd, tag) = try register(&state, path: path, fflags: fflags, reportingFor: path)
        var watch = Watch(fd: fd, tag: tag, isDirectory: isDirectory)
        if isDirectory { refreshEntries(&state, &watch, path: path) }
        return watch
    }

    /// Watches the directory's current files and forgets removed ones.
    private static func refreshEntries(_ state: inout State, _ watch: inout Watch, path: String) {
        var names = Set<String>()
        if let directory = opendir(path) {
            defer { closedir(directory) }
            while let entry = readdir(directory) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
                }
                if name != "." && name != ".." { names.insert(name) }
            }
        }
        for (name, entry) in watch.entries where !names.contains(name) {
            _ = baton_darwin_watch_vnode(state.kq, entry.fd, 0, entry.tag, 1)
            Sys.close(entry.fd)
            state.tags[entry.tag] = nil
            watch.entries[name] = nil
        }
        for name in names where watch.entries[name] == nil {
            if let entry = try? register(&state, path: path + "/" + name, fflags: baton_darwin_lock_release_events(), reportingFor: path) {
                watch.entries[name] = entry
            }
        }
    }

    private func unsubscribe(path: String, id: UInt64) {
        state.withLock { state in
            guard var watch = state.watches[path] else { return }
            watch.subscribers[id] = nil
            guard watch.subscribers.isEmpty else {
                state.watches[path] = watch
                return
            }
            for entry in watch.entries.values + [(fd: watch.fd, tag: watch.tag)] {
                _ = baton_darwin_watch_vnode(state.kq, entry.fd, 0, entry.tag, 1)
                Sys.close(entry.fd)
                state.tags[entry.tag] = nil
            }
            state.watches[path] = nil
        }
    }

    private func run(kq: Int32) {
        var tags = [UInt64](repeating: 0, count: 64)
        var flags = [UInt32](repeating: 0, count: 64)
        while true {
            let count = baton_darwin_wait_vnode(kq, &tags, &flags, 64)
            if count < 0 {
                if baton_errno() == EINTR { continue }
                return
            }
            let touched = state.withLock { state -> [Subscriber] in
                var touched: [Subscriber] = []
                var refresh = Set<String>()
                for index in 0..<Int(count) {
                    guard let path = state.tags[tags[index]], let watch = state.watches[path] else { continue }
                    touched.append(contentsOf: watch.subscribers.values)
                    if watch.isDirectory, tags[index] == watch.tag { refresh.insert(path) }
                }
                for path in refresh {
                    guard var watch = state.watches[path] else { continue }
                    Self.refreshEntries(&state, &watch, path: path)
                    state.watches[path] = watch
                }
                return touched
            }
            var seen = Set<ObjectIdentifier>()
            for subscriber in touched where seen.insert(ObjectIdentifier(subscriber.counter)).inserted {
                subscriber.counter.notify()
                subscriber.callback?()
            }
        }
    }
}
#endif
