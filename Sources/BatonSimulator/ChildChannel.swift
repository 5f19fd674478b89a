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

/// The child's side of the simulator's pipes: commands arrive on standard input, events leave
/// on standard output, one JSON object a line.
public enum ChildChannel {
    private static let output = Mutex(())

    /// Reports an event to the simulator.
    public static func emit(_ kind: SimulatorEvent.Kind, message: String? = nil, epoch: UInt64? = nil, detail: String? = nil) {
        let event = SimulatorEvent(kind: kind, message: message, epoch: epoch, detail: detail)
        guard let data = try? JSONEncoder().encode(event) else { return }
        output.withLock { _ in
            _ = LineReader.writeAll(1, String(decoding: data, as: UTF8.self) + "\n")
        }
    }

    /// The commands from the simulator; the sequence ends when standard input closes.
    public static func commands() -> AsyncStream<ChildCommand> {
        let (stream, continuation) = AsyncStream.makeStream(of: ChildCommand.self)
        LineReader.start(fd: 0, name: "sim-stdin", onLine: { line in
            if let command = try? JSONDecoder().decode(ChildCommand.self, from: Data(line.utf8)) {
                continuation.yield(command)
            }
        }, onEnd: { continuation.finish() })
        return stream
    }
}
