import Baton
import BatonDatabase
import Synchronization
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// A message received from the ``LoopbackServer``.
public struct ReceivedMessage: Sendable, Hashable {
    /// Its unique id.
    public var id: String
    /// When the server sent it (`CLOCK_MONOTONIC` ns).
    public var sent: UInt64
    /// Its content.
    public var payload: String
}

/// The app's network core in the simulation: one connection to the ``LoopbackServer``, as a
/// Baton `MessageSource`.
///
/// ``run(delivering:)`` connects, hands each message to the inbox's sink (which stores it
/// durably), acknowledges it to the server only after that, says `nothingPending()` whenever the
/// server is idle, and runs until its task is cancelled or the server closes the connection. The
/// connection is closed when it returns, so it never outlives the role that allowed it.
public struct SimulatedCoreSource: MessageSource {
    /// The server's port on 127.0.0.1.
    public let port: UInt16
    /// The role the core runs under: its current epoch goes into the server's connection record.
    let role: Role?
    /// Report `role-acquired`/`role-released` around each run (an extension's source runs only
    /// while its process holds the `executor` role, which the inbox takes and releases).
    let reportsRole: Bool
    /// Called after each message is stored (the app shows it).
    let afterStore: (@Sendable (String) async -> Void)?

    public init(port: UInt16, role: Role? = nil, reportsRole: Bool = false, afterStore: (@Sendable (String) async -> Void)? = nil) {
        self.port = port
        self.role = role
        self.reportsRole = reportsRole
        self.afterStore = afterStore
    }

    public func run(delivering sink: MessageSink) async throws {
        let epoch = (try? role?.status().epoch) ?? 0
        if reportsRole { ChildChannel.emit(.roleAcquired, epoch: epoch, detail: "executor") }
        defer { if reportsRole { ChildChannel.emit(.roleReleased, epoch: epoch, detail: "executor") } }
        try await run(epoch: epoch, receive: { message in
            try await sink.deliver(IncomingMessage(id: message.id, payload: Data(message.payload.utf8)))
            ChildChannel.emit(.stored, message: message.id, detail: reportsRole ? "executor" : "app")
            await afterStore?(message.id)
        }, isDone: {
            sink.nothingPending()
            return false
        })
    }

    private enum Line: Sendable {
        case message(ReceivedMessage)
        case idle
    }

    /// Runs one connection (``run(delivering:)`` without an inbox).
    /// - Parameters:
    ///   - epoch: The role epoch this connection runs under (the server records it).
    ///   - receive: Stores a message; it is acknowledged after this returns.
    ///   - isDone: Asked each time the server is idle; `true` ends the run.
    /// - Throws: `lost` when the server closes the connection, `CancellationError`, socket errors.
    public func run(
        epoch: UInt64,
        receive: @Sendable (ReceivedMessage) async throws -> Void,
        isDone: @Sendable () -> Bool
    ) async throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SimulatorError.system("socket", errno) }
        let closer = Mutex(false)
        @Sendable func closeOnce() {
            closer.withLock { done in
                if !done { shutdown(fd, Int32(SHUT_RDWR)) }
                done = true
            }
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = port.bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard connected else {
            let number = errno
            close(fd)
            throw SimulatorError.system("connect to 127.0.0.1:\(port)", number)
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let (lines, continuation) = AsyncStream.makeStream(of: Line.self)
        // The reader thread owns the descriptor's lifetime: it closes it at end of file.
        LineReader.start(fd: fd, name: "sim-core", onLine: { text in
            let fields = text.split(separator: " ", maxSplits: 3)
            if fields.first == "IDLE" { continuation.yield(.idle) }
            if fields.first == "MSG", fields.count == 4, let sent = UInt64(fields[2]) {
                continuation.yield(.message(ReceivedMessage(id: String(fields[1]), sent: sent, payload: String(fields[3]))))
            }
        }, onEnd: {
            continuation.finish()
            close(fd)
        })
        guard LineReader.writeAll(fd, "HELLO \(getpid()) \(epoch)\n") else {
            closeOnce()
            throw BatonError(.lost, "the message server closed the connection")
        }
        ChildChannel.emit(.connected, epoch: epoch)
        defer {
            closeOnce()
            ChildChannel.emit(.disconnected, epoch: epoch)
        }
        try await withTaskCancellationHandler {
            for await line in lines {
                try Task.checkCancellation()
                switch line {
                case .message(let message):
                    try await receive(message)
                    LineReader.writeAll(fd, "ACK \(message.id)\n")
                case .idle:
                    if isDone() { return }
                }
            }
            try Task.checkCancellation()
            throw BatonError(.lost, "the message server closed the connection")
        } onCancel: {
            closeOnce()
        }
    }
}
