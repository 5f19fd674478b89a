import Baton
import BatonCommandSupport
import CBatonShims

/// `baton bench channels`: cross-process throughput of each capacity mode and the rendezvous
/// round trip, beside a pipe stream, a pipe hand-off (element, then a one-byte ack) and a pipe
/// ping-pong of the same element size measured in the same run.
enum ChannelsBench: BenchSuite {
    static let name = "channels"
    /// The element: a string whose JSON encoding is `elementSize` bytes.
    static let element = String(repeating: "x", count: 62)
    static var elementSize: Int { element.utf8.count + 2 }
    /// The blocks the round trips are measured in, floors and channels alternated.
    static let roundTripBlocks = 4

    static func run(container path: String, quick: Bool) async throws -> (results: [BenchResult], notes: [String: String]) {
        let container = try SharedContainer(path: path)
        let streamCount = quick ? 20_000 : 200_000
        let rendezvousCount = quick ? 2_000 : 20_000
        let rounds = quick ? 2_000 : 20_000

        // The operating system's own primitives, measured in the same run.
        var streams: [OSPrimitive: Double] = [:], handoffs: [OSPrimitive: Double] = [:]
        for primitive in OSPrimitive.allCases {
            streams[primitive] = try osStreamRate(primitive, container: path, count: streamCount)
            handoffs[primitive] = try osHandoffRate(primitive, container: path, count: rendezvousCount)
        }
        let pipeStream = streams[.pipe]!, pipeHandoff = handoffs[.pipe]!
        var results: [BenchResult] = []
        for (label, capacity, count) in [("unbounded", "unbounded", streamCount), ("bounded64", "bounded:64", streamCount), ("rendezvous", "rendezvous", rendezvousCount)] {
            let rate = try await channelRate(container: container, path: path, capacity: capacity, count: count)
            results.append(BenchResult(name: "throughput_\(label)_per_s", value: rate, unit: "elements/s", floorName: "pipe_stream_per_s", floor: pipeStream))
            if label == "rendezvous" {
                results.append(BenchResult(name: "throughput_rendezvous_vs_handoff_per_s", value: rate, unit: "elements/s", floorName: "pipe_handoff_per_s", floor: pipeHandoff))
                let (bestHandoff, bestRate) = [OSPrimitive.posixMessageQueue, .unixSocket].map { ($0, handoffs[$0]!) }.max { $0.1 < $1.1 }!
                results.append(BenchResult(name: "throughput_rendezvous_vs_os_handoff_per_s", value: rate, unit: "elements/s", floorName: "\(bestHandoff.rawValue)_handoff_per_s", floor: bestRate))
            }
        }
        let structRate = try await channelRate(container: container, path: path, capacity: "unbounded", count: streamCount, structs: true)
        results.append(BenchResult(name: "throughput_unbounded_json_struct_per_s", value: structRate, unit: "elements/s", floorName: "pipe_stream_per_s", floor: pipeStream))
        // Round trips, floors and channels alternated in blocks (a quarter of the rounds each,
        // every block with new worker processes): on a loaded machine the scheduler may put the
        // two sides of a conversation on one core or on two, which changes every round trip
        // several times over and sticks for a worker's life, so each kind meets the same
        // placements and the same moments of the run.
        var trips: [OSPrimitive: [Double]] = [:], handoffTrips: [OSPrimitive: [Double]] = [:]
        var roundTrips: [Double] = [], bufferedTrips: [Double] = []
        for _ in 0..<roundTripBlocks {
            for primitive in OSPrimitive.allCases {
                trips[primitive, default: []] += try osRoundTrips(primitive, container: path, rounds: rounds / roundTripBlocks)
                if primitive != .pipe {
                    handoffTrips[primitive, default: []] += try osRoundTrips(primitive, container: path, rounds: rounds / roundTripBlocks, handingOff: true)
                }
            }
            roundTrips += try await channelPingPong(container: container, path: path, rounds: rounds / roundTripBlocks, capacity: .rendezvous)
            bufferedTrips += try await channelPingPong(container: container, path: path, rounds: rounds / roundTripBlocks, capacity: .bounded(OSLink.queueDepth))
        }
        for p in [50.0, 99.0] {
            let tag = "p\(Int(p))"
            // The target's floor: the faster of POSIX mq and the Unix socket at this percentile.
            let (best, floor) = fasterOfQueueAndSocket(trips, p)
            results.append(BenchResult(name: "rendezvous_round_trip_\(tag)_us", value: percentile(roundTrips, p), unit: "us", floorName: "\(best.rawValue)_round_trip_\(tag)_us", floor: floor))
            results.append(BenchResult(name: "rendezvous_round_trip_vs_pipe_\(tag)_us", value: percentile(roundTrips, p), unit: "us", floorName: "pipe_round_trip_\(tag)_us", floor: percentile(trips[.pipe]!, p)))
            results.append(BenchResult(name: "buffered_round_trip_\(tag)_us", value: percentile(bufferedTrips, p), unit: "us", floorName: "\(best.rawValue)_round_trip_\(tag)_us", floor: floor))
            // The same semantics from the OS: each direction a synchronous hand-off (the element,
            // then a one-byte acknowledgement), as a rendezvous send is.
            let (bestHandoff, handoffFloor) = fasterOfQueueAndSocket(handoffTrips, p)
            results.append(BenchResult(name: "rendezvous_round_trip_vs_os_handoff_\(tag)_us", value: percentile(roundTrips, p), unit: "us", floorName: "\(bestHandoff.rawValue)_handoff_round_trip_\(tag)_us", floor: handoffFloor))
        }
        // On one processor: the bench and its worker pinned to the processor the bench runs on
        // (a loaded machine often puts both sides of a conversation on one core; see notes).
        if let single = try await oneProcessorRoundTrips(container: container, path: path, rounds: rounds / roundTripBlocks) {
            for p in [50.0, 99.0] {
                let tag = "p\(Int(p))"
                let (best, floor) = fasterOfQueueAndSocket(single.os, p)
                results.append(BenchResult(name: "rendezvous_round_trip_one_processor_\(tag)_us", value: percentile(single.rendezvous, p), unit: "us", floorName: "\(best.rawValue)_round_trip_one_processor_\(tag)_us", floor: floor))
                results.append(BenchResult(name: "buffered_round_trip_one_processor_\(tag)_us", value: percentile(single.buffered, p), unit: "us", floorName: "\(best.rawValue)_round_trip_one_processor_\(tag)_us", floor: floor))
                for primitive in [OSPrimitive.posixMessageQueue, .unixSocket] {
                    results.append(BenchResult(name: "\(primitive.rawValue)_round_trip_one_processor_\(tag)_us", value: percentile(single.os[primitive]!, p), unit: "us", floorName: "pipe_round_trip_one_processor_\(tag)_us", floor: percentile(single.os[.pipe]!, p)))
                }
            }
        }
        // The OS primitives' own figures, each beside the pipe's.
        for primitive in [OSPrimitive.posixMessageQueue, .unixSocket] {
            let name = primitive.rawValue
            results.append(BenchResult(name: "\(name)_stream_per_s", value: streams[primitive]!, unit: "elements/s", floorName: "pipe_stream_per_s", floor: pipeStream))
            results.append(BenchResult(name: "\(name)_handoff_per_s", value: handoffs[primitive]!, unit: "elements/s", floorName: "pipe_handoff_per_s", floor: pipeHandoff))
            for p in [50.0, 99.0] {
                results.append(BenchResult(name: "\(name)_round_trip_p\(Int(p))_us", value: percentile(trips[primitive]!, p), unit: "us", floorName: "pipe_round_trip_p\(Int(p))_us", floor: percentile(trips[.pipe]!, p)))
                results.append(BenchResult(name: "\(name)_handoff_round_trip_p\(Int(p))_us", value: percentile(handoffTrips[primitive]!, p), unit: "us", floorName: "\(name)_round_trip_p\(Int(p))_us", floor: percentile(trips[primitive]!, p)))
            }
        }
        return (results, [
            "element": "a String of \(element.utf8.count) bytes (stored as UTF-8 text, frame \(element.utf8.count + 40) bytes rounded to 8); the json_struct row sends a Codable struct of about the same JSON size; the pipe, queue and socket carry \(elementSize) bytes per element",
            "method": "throughput: one producer process, the bench process receives \(streamCount) elements (rendezvous \(rendezvousCount)); round trip: send to the worker and its reply, \(rounds) rounds after warm-up for each kind, in \(roundTripBlocks) blocks that alternate the OS primitives' round trips with rendezvous channels (each send waits for the receiver: two synchronous hand-offs) and buffered ones (bounded \(OSLink.queueDepth), the queue depth of the POSIX mq: a send returns once the element is in, like mq_send), new worker processes in every block; handoff: the bench sends one element and waits for a one-byte acknowledgement, \(rendezvousCount) times",
            "os_primitives": "pipe: two pipes; posix_mq: two POSIX message queues (depth \(OSLink.queueDepth), priority 0); unix_socket: one connected AF_UNIX stream socket; each in its own worker process, measured in this run",
            "rendezvous_floor": "a rendezvous send returns only once a receiver took the element, so each element is a synchronous hand-off to the other process and back; a stream lets the writer run ahead and both sides batch in the kernel, which no rendezvous may do. The fair floors are the hand-offs (send one element, wait for a one-byte ack)",
            "rendezvous_round_trip_floor": "a rendezvous round trip is two synchronous hand-offs: a send returns once the peer took the element, at once when the peer already waits to receive (the element is handed to it, as in Go: then 2 wake-ups a round trip, as a queue's), otherwise when the peer takes the offered element (a wake-up more). Its like-for-like OS floor is the hand-off round trip (element, one-byte ack, element back, ack: the *_handoff_round_trip rows); the buffered round trip (bounded \(OSLink.queueDepth)) is the like-for-like of the queues' plain round trip",
            "one_processor": "the round trips again with the bench and its worker pinned to one processor (every thread; one block of a quarter of the rounds for each kind, after the plain blocks, new workers; Linux only): a loaded machine often puts both sides of a conversation on one core, where a round trip costs the processor time of both sides, context switches included, whatever either's wake-up latency. The plain round trips mix both placements by chance, block by block; these rows measure the one-core placement alone",
            "targets": "throughput ratio >= 0.5 (rendezvous: against the hand-offs); round trip p50 and p99 <= 1.5x the faster of posix_mq and unix_socket (rendezvous: also against their hand-off round trip)",
            "cores": "\(sysconf(Int32(_SC_NPROCESSORS_ONLN)))",
        ])
    }

    // MARK: Floors

    /// The faster of POSIX mq and the Unix socket at percentile `p` of their round trips in
    /// `trips` (the targets' floor), and which one it was.
    private static func fasterOfQueueAndSocket(_ trips: [OSPrimitive: [Double]], _ p: Double) -> (OSPrimitive, Double) {
        [OSPrimitive.posixMessageQueue, .unixSocket].map { ($0, percentile(trips[$0]!, p)) }.min { $0.1 < $1.1 }!
    }

    /// The round trips of the OS primitives and of both channel kinds with every thread of the
    /// bench and of its workers on one processor (the one the bench runs on); `nil` where the
    /// process cannot be pinned (not Linux).
    private static func oneProcessorRoundTrips(container: SharedContainer, path: String, rounds: Int) async throws -> (os: [OSPrimitive: [Double]], rendezvous: [Double], buffered: [Double])? {
        try await onOneProcessor {
            var os: [OSPrimitive: [Double]] = [:]
            for primitive in OSPrimitive.allCases {
                os[primitive] = try osRoundTrips(primitive, container: path, rounds: rounds)
            }
            let rendezvous = try await channelPingPong(container: container, path: path, rounds: rounds, capacity: .rendezvous)
            let buffered = try await channelPingPong(container: container, path: path, rounds: rounds, capacity: .bounded(OSLink.queueDepth))
            return (os, rendezvous, buffered)
        }
    }

    /// A worker at the other end of `primitive`, ready, and the bench's end of the link.
    private static func link(_ primitive: OSPrimitive, container: String, mode: String, extra: [String] = []) throws -> (WorkerProcess, OSLink) {
        let side = try OSLink.benchSide(primitive, container: container)
        try side.prepare()
        let worker = try WorkerProcess(suite: name, container: container, arguments: [mode, primitive.rawValue] + extra + side.arguments)
        try worker.waitReady()
        return (worker, try side.connect(worker))
    }

    /// Elements streamed by the worker as fast as the primitive carries them.
    private static func osStreamRate(_ primitive: OSPrimitive, container: String, count: Int) throws -> Double {
        let (worker, link) = try link(primitive, container: container, mode: "os-stream", extra: [String(count)])
        defer { withExtendedLifetime(worker) {} }
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: OSLink.messageCapacity, alignment: 8)
        defer { buffer.deallocate() }
        worker.send("go")
        let start = monotonicNanoseconds()
        for _ in 0..<count {
            guard link.receive(buffer, elementSize) else { throw BatonError(.invalidArgument, "the \(primitive.rawValue) stream worker stopped early") }
        }
        return Double(count) / (Double(monotonicNanoseconds() - start) / 1e9)
    }

    /// Synchronous hand-offs: send one element, wait for a one-byte acknowledgement.
    private static func osHandoffRate(_ primitive: OSPrimitive, container: String, count: Int) throws -> Double {
        let (worker, link) = try link(primitive, container: container, mode: "os-ack")
        defer { withExtendedLifetime(worker) {} }
        let bytes = [UInt8](repeating: 120, count: elementSize)
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: OSLink.messageCapacity, alignment: 8)
        defer { buffer.deallocate() }
        let warmup = count / 10
        var start: UInt64 = 0
        for index in 0..<(count + warmup) {
            if index == warmup { start = monotonicNanoseconds() }
            guard bytes.withUnsafeBytes({ link.send($0.baseAddress!, elementSize) }), link.receive(buffer, 1) else {
                throw BatonError(.invalidArgument, "the \(primitive.rawValue) ack worker stopped")
            }
        }
        return Double(count) / (Double(monotonicNanoseconds() - start) / 1e9)
    }

    /// Round trips: send one element, wait for it to come back. Handing off: each direction
    /// is a synchronous hand-off, the element then a one-byte acknowledgement (as a rendezvous:
    /// send, wait for the ack, wait for the element back, acknowledge it).
    private static func osRoundTrips(_ primitive: OSPrimitive, container: String, rounds: Int, handingOff: Bool = false) throws -> [Double] {
        let (worker, link) = try link(primitive, container: container, mode: handingOff ? "os-handoff-pong" : "os-pong")
        defer { withExtendedLifetime(worker) {} }
        let bytes = [UInt8](repeating: 120, count: elementSize)
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: OSLink.messageCapacity, alignment: 8)
        defer { buffer.deallocate() }
        var samples: [Double] = []
        samples.reserveCapacity(rounds)
        let warmup = rounds / 10
        var ack: UInt8 = 1
        for index in 0..<(rounds + warmup) {
            let start = monotonicNanoseconds()
            guard bytes.withUnsafeBytes({ link.send($0.baseAddress!, elementSize) }),
                  !handingOff || link.receive(buffer, 1),
                  link.receive(buffer, elementSize),
                  !handingOff || link.send(&ack, 1) else {
                throw BatonError(.invalidArgument, "the \(primitive.rawValue) pong worker stopped")
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

    /// Round trips through two channels of `capacity` to a worker that sends each element back.
    private static func channelPingPong(container: SharedContainer, path: String, rounds: Int, capacity: ChannelCapacity) async throws -> [Double] {
        let tag = capacity == .rendezvous ? "" : "-buffered"
        let ping = try SharedChannel<String>(container, name: "bench-ping" + tag, capacity: capacity)
        let pong = try SharedChannel<String>(container, name: "bench-pong" + tag, capacity: capacity)
        let worker = try WorkerProcess(suite: name, container: path, arguments: ["channel-pong", capacity == .rendezvous ? "rendezvous" : "bounded:\(OSLink.queueDepth)"])
        try worker.waitReady()
        return try await withTaskExecutorPreference(ping.executor) {
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
    }

    // MARK: Workers

    static func worker(arguments: [String], container path: String) async throws {
        switch arguments.first {
        case "os-stream", "os-ack", "os-pong", "os-handoff-pong":
            guard arguments.count >= 2, let primitive = OSPrimitive(rawValue: arguments[1]) else {
                throw BatonError(.invalidArgument, "bad channels worker arguments \(arguments)")
            }
            let count = arguments[0] == "os-stream" ? Int(arguments[2])! : 0
            let link = try OSLink.workerSide(primitive, arguments: Array(arguments.dropFirst(arguments[0] == "os-stream" ? 3 : 2)))
            let buffer = UnsafeMutableRawPointer.allocate(byteCount: OSLink.messageCapacity, alignment: 8)
            defer { buffer.deallocate() }
            let bytes = [UInt8]((element.debugDescription).utf8)
            precondition(bytes.count == elementSize)
            emit("ready")
            switch arguments[0] {
            case "os-stream":
                _ = readStandardInputLine()
                for _ in 0..<count { guard bytes.withUnsafeBytes({ link.send($0.baseAddress!, elementSize) }) else { return } }
            case "os-ack":
                var ack: UInt8 = 1
                while link.receive(buffer, elementSize), link.send(&ack, 1) {}
            case "os-handoff-pong":
                // Take the element and acknowledge it, send it back and wait for its ack.
                var ack: UInt8 = 1
                while link.receive(buffer, elementSize), link.send(&ack, 1), link.send(buffer, elementSize), link.receive(buffer, 1) {}
            default:
                while link.receive(buffer, elementSize), link.send(buffer, elementSize) {}
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
            guard arguments.count >= 2, let capacity = ChannelCapacity(parsing: arguments[1]) else {
                throw BatonError(.invalidArgument, "bad channels worker arguments \(arguments)")
            }
            let tag = capacity == .rendezvous ? "" : "-buffered"
            let ping = try SharedChannel<String>(container, name: "bench-ping" + tag, capacity: capacity)
            let pong = try SharedChannel<String>(container, name: "bench-pong" + tag, capacity: capacity)
            emit("ready")
            try await withTaskExecutorPreference(ping.executor) {
                while let value = try await ping.receive() { try await pong.send(value) }
            }
        default:
            throw BatonError(.invalidArgument, "unknown channels worker \(arguments)")
        }
    }
}
