import Baton
import CBatonShims
import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// A message server on 127.0.0.1 that holds messages for one user, the way a chat or payment
/// server does for a phone.
///
/// - A message is delivered over the connection of the user's core and kept until that core
///   acknowledges it (after storing it durably); a connection that closes first leaves it pending.
/// - When no core is connected, the server sends a push instead (Phoenix's rule), through
///   `onPush`; when a connection closes with unacknowledged messages and no other core is
///   connected, it pushes them again.
/// - It records every connection; two connections of the user open at once are a violation
///   (``overlappingConnections``): that would be two cores running at once.
///
/// Line protocol: the client says `HELLO <pid> <epoch>` then `ACK <id>` for each message; the
/// server says `MSG <id> <sent-ns> <payload>` and `IDLE` when nothing more is pending.
public final class LoopbackServer: Sendable {
    /// The TCP port on 127.0.0.1.
    public let port: UInt16
    private let listener: Int32
    private let timeline: Timeline
    private let onPush: @Sendable (String) -> Void
    private let state = Mutex(State())

    /// One connection the server saw.
    public struct ConnectionRecord: Sendable, Hashable {
        /// The client's process id and role epoch, as it said in `HELLO`.
        public var pid: Int32
        public var epoch: UInt64
        /// When it opened and closed (`CLOCK_MONOTONIC` ns); `closed` is nil while open.
        public var opened: UInt64
        public var closed: UInt64?
    }

    private struct Message {
        var id: String
        var payload: String
        var sent: UInt64
        var deliveredTo: Int?
    }

    private struct Connection {
        var fd: Int32
        var pid: Int32 = 0
        var epoch: UInt64 = 0
        var greeted = false
        var record: Int?
    }

    private struct State {
        var messages: [Message] = []
        var connections: [Int: Connection] = [:]
        var records: [ConnectionRecord] = []
        var nextConnection = 0
        var overlaps = 0
        var sent = 0
        var acknowledged = 0
        var stopped = false
    }

    /// Binds an ephemeral port on 127.0.0.1 and listens.
    /// - Parameters:
    ///   - timeline: Where to record sends, deliveries, acknowledgements and connections.
    ///   - onPush: Called (on a server thread) with a message id when a push must be sent.
    /// - Throws: `simulationFailed` when the socket cannot be bound.
    public init(timeline: Timeline, onPush: @escaping @Sendable (String) -> Void) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SimulatorError.system("socket", errno) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw -> Bool in
                bind(fd, raw, length) == 0 && listen(fd, 64) == 0 && getsockname(fd, raw, &length) == 0
            }
        }
        guard bound else {
            let number = errno
            close(fd)
            throw SimulatorError.system("bind/listen on 127.0.0.1", number)
        }
        self.listener = fd
        self.port = UInt16(bigEndian: address.sin_port)
        self.timeline = timeline
        self.onPush = onPush
    }

    /// Accepts connections until the task is cancelled, then closes every connection.
    public func run() async {
        KernelThread.spawn(name: "sim-server") { [self] in acceptLoop() }
        await withTaskCancellationHandler {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(3600))
            }
        } onCancel: { [self] in
            let fds = state.withLock { state -> [Int32] in
                state.stopped = true
                return state.connections.values.map(\.fd)
            }
            shutdown(listener, Int32(SHUT_RDWR))
            for fd in fds { shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    private func acceptLoop() {
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                return
            }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            let id = state.withLock { state -> Int? in
                guard !state.stopped else { return nil }
                state.nextConnection += 1
                state.connections[state.nextConnection] = Connection(fd: fd)
                return state.nextConnection
            }
            guard let id else { close(fd); return }
            LineReader.start(fd: fd, name: "sim-conn-\(id)", onLine: { [self] line in
                handle(line, from: id)
            }, onEnd: { [self] in
                closed(id)
            })
        }
    }

    /// Sends a new message to the user: delivered over the core's connection, or pushed.
    /// - Parameters:
    ///   - id: A unique message id.
    ///   - payload: Its content (no spaces or newlines).
    public func send(id: String, payload: String) {
        let now = baton_monotonic_ns()
        timeline.record(SimulatorEvent(kind: .sent, process: "server", pid: 0, message: id, time: now))
        let push = state.withLock { state -> Bool in
            state.sent += 1
            state.messages.append(Message(id: id, payload: payload, sent: now))
            guard let target = newestGreeted(state) else { return true }
            deliver(&state, to: target)
            return false
        }
        if push {
            timeline.record(.push, process: "server", message: id)
            onPush(id)
        }
    }

    private func newestGreeted(_ state: State) -> Int? {
        state.connections.filter { $0.value.greeted }.keys.max()
    }

    /// Sends every pending message not yet delivered to `target`'s connection, then `IDLE` if none remain.
    private func deliver(_ state: inout State, to target: Int) {
        guard let connection = state.connections[target] else { return }
        var text = ""
        for index in state.messages.indices where state.messages[index].deliveredTo == nil {
            state.messages[index].deliveredTo = target
            let message = state.messages[index]
            text += "MSG \(message.id) \(message.sent) \(message.payload)\n"
            timeline.record(.delivered, process: "server", message: message.id, detail: "to pid \(connection.pid)")
        }
        if !state.messages.contains(where: { $0.deliveredTo == target }) { text += "IDLE\n" }
        if !text.isEmpty { LineReader.writeAll(connection.fd, text) }
    }

    private func handle(_ line: String, from id: Int) {
        let fields = line.split(separator: " ")
        guard let verb = fields.first else { return }
        switch verb {
        case "HELLO" where fields.count >= 3:
            let pid = Int32(fields[1]) ?? 0
            let epoch = UInt64(fields[2]) ?? 0
            greet(id, pid: pid, epoch: epoch)
        case "ACK" where fields.count >= 2:
            let message = String(fields[1])
            state.withLock { state in
                guard let index = state.messages.firstIndex(where: { $0.id == message && $0.deliveredTo == id }) else { return }
                state.messages.remove(at: index)
                state.acknowledged += 1
                if !state.messages.contains(where: { $0.deliveredTo == id }), let fd = state.connections[id]?.fd {
                    LineReader.writeAll(fd, "IDLE\n")
                }
            }
            timeline.record(.acknowledged, process: "server", message: message)
        default:
            break
        }
    }

    private func greet(_ id: Int, pid: Int32, epoch: UInt64) {
        // A connection of a core that just died may still be open for a moment: the kernel
        // closes its socket while tearing the process down. Allow it 150 ms to go before
        // calling the two connections an overlap.
        var overlapping: [Int32] = []
        for _ in 0..<30 {
            overlapping = state.withLock { state in
                state.connections.filter { $0.key != id && $0.value.greeted }.map(\.value.pid)
            }
            if overlapping.isEmpty { break }
            usleep(5000)
        }
        let now = baton_monotonic_ns()
        state.withLock { state in
            guard var connection = state.connections[id] else { return }
            connection.greeted = true
            connection.pid = pid
            connection.epoch = epoch
            connection.record = state.records.count
            state.records.append(ConnectionRecord(pid: pid, epoch: epoch, opened: now))
            state.connections[id] = connection
            if !overlapping.isEmpty { state.overlaps += 1 }
            // Messages delivered to an older connection that is still open are handed to the newest.
            for index in state.messages.indices where state.messages[index].deliveredTo != nil && state.messages[index].deliveredTo != id {
                state.messages[index].deliveredTo = nil
            }
            deliver(&state, to: id)
        }
        timeline.record(.connectionOpened, process: "server", epoch: epoch, detail: "pid \(pid)")
        if !overlapping.isEmpty {
            timeline.record(.overlap, process: "server", epoch: epoch, detail: "pid \(pid) connected while pid \(overlapping.map(String.init).joined(separator: ",")) was still connected")
        }
    }

    private func closed(_ id: Int) {
        let now = baton_monotonic_ns()
        let (pushes, pid) = state.withLock { state -> ([String], Int32?) in
            guard let connection = state.connections.removeValue(forKey: id) else { return ([], nil) }
            close(connection.fd)
            if let record = connection.record { state.records[record].closed = now }
            var orphans: [String] = []
            for index in state.messages.indices where state.messages[index].deliveredTo == id {
                state.messages[index].deliveredTo = nil
                orphans.append(state.messages[index].id)
            }
            if let other = newestGreeted(state) {
                deliver(&state, to: other)
                return ([], connection.greeted ? connection.pid : nil)
            }
            return (state.stopped ? [] : orphans, connection.greeted ? connection.pid : nil)
        }
        if let pid { timeline.record(.connectionClosed, process: "server", detail: "pid \(pid)") }
        for message in pushes {
            timeline.record(.push, process: "server", message: message, detail: "again")
            onPush(message)
        }
    }

    /// Every connection seen so far.
    public var connections: [ConnectionRecord] { state.withLock { $0.records } }
    /// How many times a core connected while another core's connection was still open.
    public var overlappingConnections: Int { state.withLock { $0.overlaps } }
    /// Messages sent, and acknowledged by a core.
    public var counts: (sent: Int, acknowledged: Int, pending: Int) {
        state.withLock { ($0.sent, $0.acknowledged, $0.messages.count) }
    }
    /// Whether a core is connected now.
    public var isCoreConnected: Bool { state.withLock { newestGreeted($0) != nil } }

    deinit { close(listener) }
}
