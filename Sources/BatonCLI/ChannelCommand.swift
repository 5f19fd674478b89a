import ArgumentParser
import Baton
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Any JSON value: what the command line sends and receives on a channel.
enum JSONElement: Codable, Sendable, Hashable {
    case null
    case bool(Bool)
    case int(Int)
    case double(Double)
    case string(String)
    case array([JSONElement])
    case object([String: JSONElement])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let value = try? container.decode(Bool.self) { self = .bool(value) }
        else if let value = try? container.decode(Int.self) { self = .int(value) }
        else if let value = try? container.decode(Double.self) { self = .double(value) }
        else if let value = try? container.decode(String.self) { self = .string(value) }
        else if let value = try? container.decode([JSONElement].self) { self = .array(value) }
        else { self = .object(try container.decode([String: JSONElement].self)) }
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .int(let value): try container.encode(value)
        case .double(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// Parses a JSON text (any value, not only objects and arrays).
    static func parse(_ text: String) throws -> JSONElement {
        do {
            return try JSONDecoder().decode(JSONElement.self, from: Data(text.utf8))
        } catch {
            throw ValidationError("not a JSON value: \(text.prefix(40))")
        }
    }
}

extension ChannelCapacity: ExpressibleByArgument {
    public init?(argument: String) { self.init(parsing: argument) }
}

/// The channel options of the command line: the name and, when creating, the capacity.
struct ChannelOptions: ParsableArguments {
    @OptionGroup var options: ContainerOptions
    @Argument(help: "The channel name (1-255 bytes, no '/').") var name: String
    @Option(help: "rendezvous, bounded:N or unbounded; used when the channel does not exist yet (default unbounded).")
    var capacity: ChannelCapacity?

    func open() throws -> SharedChannel<JSONElement> {
        let container = try options.open()
        // The channel layer reads an existing channel's capacity with a plain blocking open;
        // refuse a FIFO or directory planted in its place before it gets there.
        try SharedContainer.validateName(name, what: "a channel name")
        switch Result(catching: { try container.openFile("channels/" + name, flags: O_RDONLY) }) {
        case .success(let fd): close(fd)
        case .failure(let error as BatonError) where error.code == .notFound: break
        case .failure(let error): throw error
        }
        if let capacity { return try SharedChannel(container, name: name, capacity: capacity) }
        return try SharedChannel(container, existingOrNewNamed: name, capacity: .unbounded)
    }
}

struct ChannelCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "channel",
        abstract: "Send, receive and close cross-process channels.",
        subcommands: [Send.self, Receive.self, Close.self, ChannelTestCommand.self]
    )

    struct Send: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Send one JSON value. Exits 0 once sent (rendezvous: once received), 3 on timeout, 5 when the channel is closed.")
        @OptionGroup var channel: ChannelOptions
        @Argument(help: "A JSON value, e.g. '{\"id\": 7}' or '\"hello\"'.") var json: String
        @Option(help: "Give up after this many seconds.", transform: ArgumentCheck.seconds) var timeout: Double?

        func run() async throws {
            let element = try JSONElement.parse(json)
            let channel = try self.channel.open()
            do {
                try await channel.send(element, deadline: try .option(timeout))
            } catch let error as BatonError where error.code == .timedOut {
                throw CommandOutcome.timedOut("no receiver or no room in channel \(self.channel.name)", after: timeout)
            } catch let error as BatonError where error.code == .closed {
                throw CommandOutcome(.ended, "closed: channel \(self.channel.name) is closed; nothing more can be sent")
            }
        }
    }

    struct Receive: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print received JSON values, one per line. Exits 0 after --count values or when the channel is closed and drained, 3 on timeout.")
        @OptionGroup var channel: ChannelOptions
        @Option(help: "Exit after this many values.", transform: ArgumentCheck.count) var count: Int?
        @Option(help: "Exit with status 3 when the next value takes longer than this many seconds.", transform: ArgumentCheck.seconds) var timeout: Double?

        func run() async throws {
            let channel = try self.channel.open()
            var received = 0
            while count.map({ received < $0 }) ?? true {
                do {
                    guard let element = try await channel.receive(deadline: try .option(timeout)) else { return }
                    received += 1
                    emit(try jsonLine(element))
                } catch let error as BatonError where error.code == .timedOut {
                    throw CommandOutcome.timedOut("\(received) values received from channel \(self.channel.name), no next one", after: timeout)
                } catch let error as BatonError where error.code == .malformedFrame {
                    FileHandleOutput.standardError("skipped: \(error)")
                }
            }
        }
    }

    struct Close: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Close a channel: receivers drain it, then end; sends fail.")
        @OptionGroup var channel: ChannelOptions

        func run() async throws {
            try channel.open().close()
        }
    }
}

/// Test-only workers (hidden): bulk producers and consumers, and a receiver that takes an
/// element without acknowledging it.
struct ChannelTestCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "test-worker", abstract: "Channel test workers (internal).", shouldDisplay: false,
        subcommands: [Produce.self, Consume.self, Hold.self, HoldLock.self, ProduceRaw.self, EchoText.self, ReceiveAndDie.self,
                      SelectReceive.self, OfferLoop.self])

    struct Produce: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Send the integers from..<from+count, then print 'sent N'.")
        @OptionGroup var channel: ChannelOptions
        @Option(transform: ArgumentCheck.count) var from: Int
        @Option(transform: ArgumentCheck.count) var count: Int

        func run() async throws {
            let channel = try self.channel.open()
            emit("ready")
            for value in from..<(from + count) {
                try await channel.send(.int(value))
            }
            emit("sent \(count)")
        }
    }

    struct Consume: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Receive until closed and drained; print received integers in comma-separated batches ('got a,b,...'), then 'done N'.")
        @OptionGroup var channel: ChannelOptions
        @Option(transform: ArgumentCheck.positiveCount) var batch: Int = 1_000

        func run() async throws {
            let channel = try self.channel.open()
            emit("ready")
            var pending: [String] = []
            var total = 0
            while let element = try await channel.receive() {
                guard case .int(let value) = element else { continue }
                pending.append(String(value))
                total += 1
                if pending.count >= batch {
                    emit("got " + pending.joined(separator: ","))
                    pending.removeAll(keepingCapacity: true)
                }
            }
            if !pending.isEmpty { emit("got " + pending.joined(separator: ",")) }
            emit("done \(total)")
        }
    }

    struct ProduceRaw: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Send `count` byte arrays on NAME (element i: i % 300 bytes, byte j = (i + j) % 256), then `count` strings on NAME-text (element i: \"i:\" and i % 40 times \"é✓x\"), then print 'sent'.")
        @OptionGroup var options: ContainerOptions
        @Argument var name: String
        @Option(transform: ArgumentCheck.count) var count: Int

        func run() async throws {
            let container = try options.open()
            let bytes = try SharedChannel<[UInt8]>(container, name: name, capacity: .unbounded)
            let texts = try SharedChannel<String>(container, name: name + "-text", capacity: .unbounded)
            emit("ready")
            for index in 0..<count {
                try await bytes.send((0..<(index % 300)).map { UInt8(truncatingIfNeeded: index + $0) })
            }
            for index in 0..<count {
                try await texts.send("\(index):" + String(repeating: "é✓x", count: index % 40))
            }
            emit("sent")
        }
    }

    struct EchoText: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Receive strings from the rendezvous channel NAME and send each back on REPLY (rendezvous), until NAME is closed.")
        @OptionGroup var options: ContainerOptions
        @Argument var name: String
        @Argument var reply: String

        func run() async throws {
            let container = try options.open()
            let requests = try SharedChannel<String>(container, name: name, capacity: .rendezvous)
            let replies = try SharedChannel<String>(container, name: reply, capacity: .rendezvous)
            emit("ready")
            while let text = try await requests.receive() {
                try await replies.send(text, deadline: .after(.seconds(60)))
            }
            emit("done")
        }
    }

    struct ReceiveAndDie: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "receive-and-die",
            abstract: "Print 'ready', receive one element, and die (SIGKILL) right after its acknowledgement released the lock.")
        @OptionGroup var channel: ChannelOptions

        func run() async throws {
            let channel = try self.channel.open()
            emit("ready")
            guard let delivery = try await channel.takeUnacknowledged(deadline: .never) else { return }
            SharedChannel<JSONElement>.killProcessAfterNextAcknowledgeForTesting()
            _ = try delivery.acknowledge()
        }
    }

    struct HoldLock: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Take the channel's mutex, print 'locked', and hold it until killed.")
        @OptionGroup var channel: ChannelOptions

        func run() async throws {
            try self.channel.open().holdLockForever { emit("locked") }
        }
    }

    struct Hold: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Take one element without acknowledging it, print 'taken JSON', then wait to be killed.")
        @OptionGroup var channel: ChannelOptions

        func run() async throws {
            TerminationSignal.prepare()
            let channel = try self.channel.open()
            emit("ready")
            guard let delivery = try await channel.takeUnacknowledged(deadline: .never) else { return }
            emit("taken " + (try jsonLine(delivery.element)))
            await TerminationSignal.wait()
            _ = try delivery.acknowledge()
        }
    }
    struct SelectReceive: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "select-receive",
            abstract: "Print 'ready', then `count` times select a receive of an Int from the rendezvous channels X and Y (a 10 s deadline each; a timeout prints 'timeout'), printing 'got NAME VALUE' for each.")
        @OptionGroup var options: ContainerOptions
        @Argument var x: String
        @Argument var y: String
        @Option(transform: ArgumentCheck.positiveCount) var count: Int = 1

        func run() async throws {
            let container = try options.open()
            let xs = try SharedChannel<Int>(container, name: x, capacity: .rendezvous)
            let ys = try SharedChannel<Int>(container, name: y, capacity: .rendezvous)
            emit("ready")
            for _ in 0..<count {
                do {
                    let got = try await select(
                        .receive(from: xs) { [x] value in "got \(x) \(value.map(String.init) ?? "end")" },
                        .receive(from: ys) { [y] value in "got \(y) \(value.map(String.init) ?? "end")" },
                        deadline: .after(.seconds(10)))
                    emit(got)
                } catch let error as BatonError where error.code == .timedOut {
                    emit("timeout")
                }
            }
            emit("done")
        }
    }

    struct OfferLoop: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "offer-loop",
            abstract: "Send the Ints from..<from+count to the rendezvous channels X or Y, each until it is accepted: by trySend on X, then on Y, then a select offering it to both for 50 ms; print 'acked VALUE' once sent.")
        @OptionGroup var options: ContainerOptions
        @Argument var x: String
        @Argument var y: String
        @Option(transform: ArgumentCheck.count) var from: Int
        @Option(transform: ArgumentCheck.count) var count: Int

        func run() async throws {
            let container = try options.open()
            let xs = try SharedChannel<Int>(container, name: x, capacity: .rendezvous)
            let ys = try SharedChannel<Int>(container, name: y, capacity: .rendezvous)
            emit("ready")
            for value in from..<(from + count) {
                while true {
                    if try xs.trySend(value) || ys.trySend(value) { break }
                    do {
                        try await select(.send(value, to: xs) {}, .send(value, to: ys) {}, deadline: .after(.milliseconds(50)))
                        break
                    } catch let error as BatonError where error.code == .timedOut {}
                }
                emit("acked \(value)")
            }
            emit("sent")
        }
    }
}
