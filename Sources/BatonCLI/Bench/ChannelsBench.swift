import Baton
import CBatonShims

/// `baton bench channels`: cross-process throughput of each capacity mode and the rendezvous
/// round trip, beside a pipe stream, a pipe hand-off (element, then a one-byte ack) and a pipe
/// ping-pong of the same element size measured in the same run.
enum ChannelsBench: BenchSuite {
    static let name = "channels"
    /// The element: a string whose JSON encoding is `elementSize` bytes.
    static let element = String(repeating: "x", count: 62)
    static var elementSize: Int { element.utf8.count + 2 }

    static func run(container path: String, quick: Bool) async throws -> (results: [BenchResult], notes: [String: String]) {
        let container = try SharedContainer(path: path)
        let streamCount = quick ? 20_000 : 200_000
        let rendezvousCount = quick ? 2_000 : 20_000
        let rounds = quick ? 2_000 : 20_000

        let pipeStream = try pipeStreamRate(container: path, count: streamCount)
        let pipeHandoff = try pipeHandoffRate(container: path, count: rendezvousCount)
        let pipeRoundTrip = try pipePingPong(container: path, rounds: rounds)
        var results: [BenchResult] = []
        for (label, capacity, count) in [("unbounded", "unbounded", streamCount), ("bounded64", "bounded:64", streamCount), ("rendezvous", "rendezvous", rendezvousCount)] {
            let rate = try await channelRate(container: container, path: path, capacity: capacity, count: count)
            results.append(BenchResult(name: "throughput_\(label)_per_s", value: rate, unit: "elements/s", floorName: "pipe_stream_per_s", floor: pipeStream))
            if label == "rendezvous" {
                results.append(BenchResult(name: "throughput_rendezvous_vs_handoff_per_s", value: rate, unit: "elements/s", floorName: "pipe_handoff_per_s", floor: pipeHandoff))
            }
        }
        let structRate = try await channelRate(container: container, path: path, capacity: "unbounded", count: streamCount, structs: true)
        results.append(BenchResult(name: "throughput_unbounded_json_struct_per_s", value: structRate, unit: "elements/s", floorName: "pipe_stream_per_s", floor: pipeStream))
        let roundTrips = try await channelPingPong(container: container, path: path, rounds: rounds)
        results.append(BenchResult(name: "rendezvous_round_trip_p50_us", value: percentile(roundTrips, 50), unit: "us", floorName: "pipe_round_trip_p50_us", floor: percentile(pipeRoundTrip, 50)))
        results.append(BenchResult(name: "rendezvous_round_trip_p99_us", value: percentile(roundTrips, 99), unit: "us", floorName: "pipe_round_trip_p99_us", floor: percentile(pipeRoundTrip, 99)))
        return (results, [
            "element": "a String of \(element.utf8.count) bytes (stored as UTF-8 text, frame \(element.utf8.count + 40) bytes rounded to 8); the json_struct row sends a Codable struct of about the same JSON size; the pipe writes and reads \(elementSize) bytes per element",
            "method": "throughput: one producer process, the bench process receives \(streamCount) elements (rendezvous \(rendezvousCount)); round trip: rendezvous send to the worker and rendezvous reply, \(rounds) rounds after warm-up; pipe_handoff: the bench writes one element and waits for a one-byte acknowledgement, \(rendezvousCount) times",
            "rendezvous_floor": "a rendezvous send returns only once a receiver took the element, so each element is a synchronous hand-off to the other process and back; the pipe stream lets the writer run up to 64 KiB (about 1,000 elements) ahead and both sides batch in the kernel, which no rendezvous may do. The fair floor is pipe_handoff (write one element, wait for a one-byte ack); throughput_rendezvous_per_s against the stream is kept for comparison",
            "targets": "throughput ratio >= 0.5 (rendezvous: against pipe_handoff), round-trip ratio <= 3",
            "cores": "\(sysconf(Int32(_SC_NPROCESSORS_ONLN)))",
        ])
    }

    // MARK: Floors

    private static func pipeStreamRate(container: String, count: Int) throws -> Double {
        let worker = try WorkerProcess(suite: name, container: container, arguments: ["pipe-stream", String(count)])
        try worker.waitReady()
        var buffer = [UInt8](repeating: 0, count: elementSize)
        worker.send("go")
        let start = monotonicNanoseconds()
        for _ in 0..<count {
            var done = 0
            while done < elementSize {
                let got = buffer.withUnsafeMutableBytes { read(worker.output, $0.baseAddress! + done, elementSize - done) }
                guard got > 0 else { throw BatonError(.invalidArgument, "the pipe-stream worker stopped early") }
                done += got
            }
        }
        return Double(count) / (Double(monotonicNanoseconds() - start) / 1e9)
    }

    /// Synchronous hand-offs through pipes: write one element, wait for a one-byte ack.
    private static func pipeHandoffRate(container: String, count: Int) throws -> Double {
        let worker = try WorkerProcess(suite: name, container: container, arguments: ["pipe-ack"])
        try worker.waitReady()
        let buffer = [UInt8](repeating: 120, count: elementSize)
        var ack: UInt8 = 0
        let warmup = count / 10
        var start: UInt64 = 0
        for index in 0..<(count + warmup) {
            if index == warmup { start = monotonicNanoseconds() }
            _ = buffer.withUnsafeBytes { write(worker.input, $0.baseAddress!, elementSize) }
            guard read(worker.output, &ack, 1) == 1 else { throw BatonError(.invalidArgument, "the pipe-ack worker stopped") }
        }
        return Double(count) / (Double(monotonicNanoseconds() - start) / 1e9)
    }

    private static func pipePingPong(container: String, rounds: Int) throws -> [Double] {
        let worker = try WorkerProcess(suite: name, container: container, arguments: ["pipe-pong"])
        try worker.waitReady()
        var buffer = [UInt8](repeating: 120, count: elementSize)
        var samples: [Double] = []
        let warmup = rounds / 10
        for index in 0..<(rounds + warmup) {
            let start = monotonicNanoseconds()
            _ = buffer.withUnsafeBytes { write(worker.input, $0.baseAddress!, elementSize) }
            var done = 0
            while done < elementSize {
                let got = buffer.withUnsafeMutableBytes { read(worker.output, $0.baseAddress! + done, elementSize - done) }
                guard got > 0 else { throw BatonError(.invalidArgument, "the pipe-pong worker stopped") }
                done += got
            }
            if index >= warmup { samples.append(Double(monotonicNanoseconds() - start) / 1_000) }
        }
        return samples
    }

    // MARK: Channels

    /// A Codable struct whose JSON encoding is about as long as the string element.
    struct Record: Codable, Sendable {
        var id: Int
        var text: String
        static let sample = Record(id: 123_456, text: String(repeating: "y", count: 42))
    }

    private static func channelRate(container: SharedContainer, path: String, capacity: String, count: Int, structs: Bool = false) async throws -> Double {
        let channelName = "bench-" + String(capacity.map { $0 == ":" ? "-" : $0 }) + (structs ? "-structs" : "")
        let worker = try WorkerProcess(suite: name, container: path, arguments: [structs ? "produce-structs" : "produce", channelName, capacity, String(count)])
        try worker.waitReady()
        if structs {
            let channel = try SharedChannel<Record>(container, name: channelName, capacity: ChannelCapacity(parsing: capacity)!)
            return try await receiveAll(channel, count: count, worker: worker)
        }
        let channel = try SharedChannel<String>(container, name: channelName, capacity: ChannelCapacity(parsing: capacity)!)
        return try await receiveAll(channel, count: count, worker: worker)
    }

    private static func receiveAll<Element>(_ channel: SharedChannel<Element>, count: Int, worker: WorkerProcess) async throws -> Double {
        worker.send("go")
        let start = monotonicNanoseconds()
        for _ in 0..<count {
            guard try await channel.receive(deadline: .after(.seconds(30))) != nil else {
                throw BatonError(.invalidArgument, "the producer closed the channel early")
            }
        }
        return Double(count) / (Double(monotonicNanoseconds() - start) / 1e9)
    }

    private static func channelPingPong(container: SharedContainer, path: String, rounds: Int) async throws -> [Double] {
        let ping = try SharedChannel<String>(container, name: "bench-ping", capacity: .rendezvous)
        let pong = try SharedChannel<String>(container, name: "bench-pong", capacity: .rendezvous)
        let worker = try WorkerProcess(suite: name, container: path, arguments: ["channel-pong"])
        try worker.waitReady()
        var samples: [Double] = []
        let warmup = rounds / 10
        for index in 0..<(rounds + warmup) {
            let start = monotonicNanoseconds()
            try await ping.send(element, deadline: .after(.seconds(30)))
            _ = try await pong.receive(deadline: .after(.seconds(30)))
            if index >= warmup { samples.append(Double(monotonicNanoseconds() - start) / 1_000) }
        }
        return samples
    }

    // MARK: Workers

    static func worker(arguments: [String], container path: String) async throws {
        switch arguments.first {
        case "pipe-stream":
            let count = Int(arguments[1])!
            let bytes = [UInt8]((element.debugDescription).utf8)
            precondition(bytes.count == elementSize)
            emit("ready")
            _ = readStandardInputLine()
            for _ in 0..<count {
                _ = bytes.withUnsafeBytes { write(1, $0.baseAddress!, elementSize) }
            }
        case "pipe-pong":
            emit("ready")
            var buffer = [UInt8](repeating: 0, count: elementSize)
            while readElement(into: &buffer) {
                _ = buffer.withUnsafeBytes { write(1, $0.baseAddress!, elementSize) }
            }
        case "pipe-ack":
            emit("ready")
            var buffer = [UInt8](repeating: 0, count: elementSize)
            var ack: UInt8 = 1
            while readElement(into: &buffer) {
                _ = write(1, &ack, 1)
            }
        case "produce":
            let container = try SharedContainer(path: path)
            let channel = try SharedChannel<String>(container, name: arguments[1], capacity: ChannelCapacity(parsing: arguments[2])!)
            let count = Int(arguments[3])!
            emit("ready")
            _ = readStandardInputLine()
            for _ in 0..<count { try await channel.send(element) }
        case "produce-structs":
            let container = try SharedContainer(path: path)
            let channel = try SharedChannel<Record>(container, name: arguments[1], capacity: ChannelCapacity(parsing: arguments[2])!)
            let count = Int(arguments[3])!
            emit("ready")
            _ = readStandardInputLine()
            for _ in 0..<count { try await channel.send(Record.sample) }
        case "channel-pong":
            let container = try SharedContainer(path: path)
            let ping = try SharedChannel<String>(container, name: "bench-ping", capacity: .rendezvous)
            let pong = try SharedChannel<String>(container, name: "bench-pong", capacity: .rendezvous)
            emit("ready")
            while let value = try await ping.receive() { try await pong.send(value) }
        default:
            throw BatonError(.invalidArgument, "unknown channels worker \(arguments)")
        }
    }

    /// Reads exactly `buffer.count` bytes from standard input; `false` at end of input.
    private static func readElement(into buffer: inout [UInt8]) -> Bool {
        let size = buffer.count
        var done = 0
        while done < size {
            let got = buffer.withUnsafeMutableBytes { read(0, $0.baseAddress! + done, size - done) }
            if got <= 0 { return false }
            done += got
        }
        return true
    }
}
