import Baton
import BatonDatabase
import CBatonShims
import Dispatch
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

/// A ``MessageSource`` over the ``LoopbackMessageServer``: the "network core" of the inbox's
/// tests and benchmark. Connects, announces itself as a core, stores each `MSG` through the
/// sink before acknowledging it, and reports `IDLE` as nothing pending. Reads are driven by a
/// Dispatch read source (no thread blocked, no polling); cancellation closes the socket.
package struct LoopbackMessageSource: MessageSource {
    package let port: UInt16
    /// Simulated core start-up time, before connecting (a real core takes a while to start).
    package var startupDelay: Duration = .zero
    /// Called when the core is connected, and after each stored message (for test output).
    package var onEvent: @Sendable (String) -> Void = { _ in }

    /// A source for the server on `port`.
    package init(port: UInt16, startupDelay: Duration = .zero, onEvent: @escaping @Sendable (String) -> Void = { _ in }) {
        self.port = port
        self.startupDelay = startupDelay
        self.onEvent = onEvent
    }

    package func run(delivering sink: MessageSink) async throws {
        if startupDelay > .zero { try await Task.sleep(for: startupDelay) }
        let socket = Socket(try Self.connect(port: port))
        let lines = Self.lines(of: socket)
        try socket.writeLine("CORE")
        onEvent("source-connected")
        for await line in lines {
            try Task.checkCancellation()
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            switch fields.first {
            case "MSG" where fields.count == 3:
                guard let bytes = Hex.decode(String(fields[2])) else { continue }
                let id = String(fields[1])
                try await sink.deliver(IncomingMessage(id: id, payload: Data(bytes)))
                onEvent("stored \(id)")
                try socket.writeLine("ACK \(id)")
            case "IDLE":
                sink.nothingPending()
            default:
                continue
            }
        }
        try Task.checkCancellation()
        throw BatonError(.notFound, "the loopback message server on port \(port) closed the connection")
    }

    /// A connected socket that is closed once, under a lock that writers also take, so a write
    /// never lands on a descriptor number that was closed and reused.
    private final class Socket: Sendable {
        private let descriptor: Mutex<Int32?>
        let fd: Int32
        init(_ fd: Int32) {
            self.fd = fd
            descriptor = Mutex(fd)
        }
        func writeLine(_ line: String) throws {
            try descriptor.withLock { fd in
                guard let fd else { throw CancellationError() }
                try LoopbackMessageSource.writeLine(line, to: fd)
            }
        }
        func close() {
            descriptor.withLock { fd in
                if let open = fd { _ = POSIX.close(open) }
                fd = nil
            }
        }
    }

    /// The socket's lines; finishing the stream (cancellation) closes the socket.
    private static func lines(of socket: Socket) -> AsyncStream<String> {
        let fd = socket.fd
        return AsyncStream { continuation in
            let queue = DispatchQueue(label: "baton.loopback-source")
            let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
            let buffer = LineBuffer()
            source.setEventHandler {
                var chunk = [UInt8](repeating: 0, count: 65_536)
                let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count <= 0 {
                    if count < 0 && (errno == EAGAIN || errno == EINTR) { return }
                    continuation.finish()
                    return
                }
                for line in buffer.append(chunk[0..<count]) { continuation.yield(line) }
            }
            source.setCancelHandler { socket.close() }
            let cancellable = CancellableSource(source)
            continuation.onTermination = { _ in cancellable.cancel() }
            source.resume()
        }
    }

    /// A Dispatch source to cancel from the stream's termination handler.
    private final class CancellableSource: @unchecked Sendable {
        // @unchecked: `DispatchSource.cancel()` is thread-safe; nothing else is touched.
        private let source: any DispatchSourceRead
        init(_ source: any DispatchSourceRead) { self.source = source }
        func cancel() { source.cancel() }
    }

    /// Splits bytes into lines; touched only on the source's serial queue.
    private final class LineBuffer: @unchecked Sendable {
        // @unchecked: used only from the serial `baton.loopback-source` queue.
        private var pending: [UInt8] = []
        func append(_ bytes: ArraySlice<UInt8>) -> [String] {
            pending.append(contentsOf: bytes)
            var lines: [String] = []
            while let newline = pending.firstIndex(of: 10) {
                lines.append(String(decoding: pending[..<newline], as: UTF8.self))
                pending.removeSubrange(...newline)
            }
            return lines
        }
    }

    package static func connect(port: UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw BatonError(.systemCallFailed, "socket() failed: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { POSIX.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else {
            let code = errno
            close(fd)
            throw BatonError(.notFound, "cannot connect to the loopback message server on 127.0.0.1:\(port) (errno \(code)); start it with `baton inbox loopback serve`")
        }
        return fd
    }

    package static func writeLine(_ line: String, to fd: Int32) throws {
        var bytes = Array((line + "\n").utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeMutableBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if written < 0 {
                if errno == EINTR { continue }
                throw BatonError(.systemCallFailed, "writing to the loopback message server failed: errno \(errno)")
            }
            offset += written
        }
    }

    /// Sends one control command on a fresh connection and returns the reply line (blocking).
    package static func command(_ line: String, port: UInt16) throws -> String {
        let fd = try connect(port: port)
        defer { close(fd) }
        try writeLine(line, to: fd)
        var reply: [UInt8] = []
        var byte: UInt8 = 0
        while read(fd, &byte, 1) == 1 {
            if byte == 10 { break }
            reply.append(byte)
        }
        return String(decoding: reply, as: UTF8.self)
    }
}
