import Baton
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

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
            var pending: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 16384)
            while true {
                let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count < 0 && errno == EINTR { continue }
                if count <= 0 { break }
                pending.append(contentsOf: buffer[0..<count])
                var start = 0
                while let newline = pending[start...].firstIndex(of: 10) {
                    onLine(String(decoding: pending[start..<newline], as: UTF8.self))
                    start = newline + 1
                }
                pending.removeFirst(start)
            }
            if !pending.isEmpty { onLine(String(decoding: pending, as: UTF8.self)) }
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
                if written <= 0 { return false }
                offset += written
            }
            return true
        }
    }
}
