import BatonSpawn
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

/// The child's side of the lifecycle protocol: events arrive and reports leave on the descriptor
/// `BATON_LIFECYCLE_FD` names (standard input and output when it is not set), one JSON object
/// a line.
public enum ChildChannel {
    private static let output = Mutex(())

    /// The protocol's descriptors: the inherited socket, or standard input and output.
    private static let descriptors: (input: Int32, output: Int32) = {
        if let name = getenv("BATON_LIFECYCLE_FD"), let fd = Int32(String(cString: name)), fd >= 0 {
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            return (fd, fd)
        }
        return (0, 1)
    }()

    /// Reports an event to the simulator.
    public static func emit(_ kind: SimulatorEvent.Kind, message: String? = nil, epoch: UInt64? = nil, detail: String? = nil) {
        let event = SimulatorEvent(kind: kind, message: message, epoch: epoch, detail: detail)
        guard let data = try? JSONEncoder().encode(event) else { return }
        output.withLock { _ in
            _ = LineReader.writeAll(descriptors.output, String(decoding: data, as: UTF8.self) + "\n")
        }
    }

    /// The commands from the simulator; the sequence ends when standard input closes.
    public static func commands() -> AsyncStream<ChildCommand> {
        let (stream, continuation) = AsyncStream.makeStream(of: ChildCommand.self)
        LineReader.start(fd: descriptors.input, name: "sim-stdin", onLine: { line in
            if let command = try? JSONDecoder().decode(ChildCommand.self, from: Data(line.utf8)) {
                continuation.yield(command)
            }
        }, onEnd: { continuation.finish() })
        return stream
    }
}
