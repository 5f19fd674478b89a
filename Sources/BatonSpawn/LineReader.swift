import Baton
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// Line I/O of Baton's child processes and loopback sockets.
///
/// Reads newline-terminated lines from a descriptor on a ``KernelThread`` and hands each to
/// a handler; calls `onEnd` once at end of file or error. The descriptor is not closed: a pipe of a
/// ``SpawnedProcess`` is closed by it; one the caller owns, by the caller.
package enum LineReader {
    package static func start(
        fd: Int32,
        name: String,
        onLine: @escaping @Sendable (String) -> Void,
        onEnd: @escaping @Sendable () -> Void
    ) {
        KernelThread.spawn(name: name) {
            var splitter = LineSplitter()
            var buffer = [UInt8](repeating: 0, count: 16384)
            while true {
                let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count < 0 && errno == EINTR { continue }
                if count <= 0 { break }
                for line in splitter.append(buffer[0..<count]) { onLine(line) }
            }
            if let rest = splitter.rest { onLine(rest) }
            onEnd()
        }
    }

    /// Writes all of `text` to `fd`; returns false when the other end is gone.
    @discardableResult
    package static func writeAll(_ fd: Int32, _ text: String) -> Bool {
        var text = text
        return text.withUTF8 { buffer -> Bool in
            var offset = 0
            while offset < buffer.count {
                let written = send(fd, buffer.baseAddress! + offset, buffer.count - offset, Int32(MSG_NOSIGNAL))
                if written < 0 && errno == ENOTSOCK {
                    let plain = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                    if plain < 0 && errno == EINTR { continue }
                    if plain <= 0 { return false }
                    offset += plain
                    continue
                }
                if written < 0 && errno == EINTR { continue }
                if written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                    // A non-blocking socket that is full: wait until it drains.
                    var entry = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                    _ = poll(&entry, 1, 100)
                    continue
                }
                if written <= 0 { return false }
                offset += written
            }
            return true
        }
    }
}

/// Splits a byte stream into lines.
package struct LineSplitter: Sendable {
    private var pending: [UInt8] = []

    package init() {}

    /// Appends bytes and returns the complete lines (without newlines).
    package mutating func append(_ bytes: some Collection<UInt8>) -> [String] {
        pending.append(contentsOf: bytes)
        var lines: [String] = []
        var start = 0
        while let newline = pending[start...].firstIndex(of: 10) {
            lines.append(String(decoding: pending[start..<newline], as: UTF8.self))
            start = newline + 1
        }
        pending.removeFirst(start)
        return lines
    }

    /// What is left after the last newline, if anything (a last line without one).
    package var rest: String? { pending.isEmpty ? nil : String(decoding: pending, as: UTF8.self) }
}
