import ArgumentParser
import Baton
import BatonCommandSupport
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

/// `baton-harness channel ...`: the channel tests' worker processes.
struct ChannelWorkers: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "channel", abstract: "Channel test workers.", subcommands: [ChannelTestCommand.self])
}

/// `baton-harness channel test-worker ...`: bulk producers and consumers, and a receiver that takes an
/// element without acknowledging it.
struct ChannelTestCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "test-worker", abstract: "Channel test workers.",
        subcommands: [Produce.self, Consume.self, Hold.self, HoldLock.self, ProduceRaw.self, EchoText.self, ReceiveAndDie.self, ReceiveAndDieBeforeRing.self,
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

    struct ReceiveAndDieBeforeRing: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "receive-and-die-before-ring",
            abstract: "Print 'ready', receive one element, and die (SIGKILL) after its acknowledgement released the lock but before it rang.")
        @OptionGroup var channel: ChannelOptions

        func run() async throws {
            let channel = try self.channel.open()
            emit("ready")
            guard let delivery = try await channel.takeUnacknowledged(deadline: .never) else { return }
            SharedChannel<JSONElement>.killProcessBeforeNextRingForTesting()
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
            abstract: "Print 'ready', then `count` times select a receive of an Int from the rendezvous channels X and Y (a 30 s deadline each; a timeout prints 'timeout'), printing 'got NAME VALUE' for each.")
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
                        deadline: .after(.seconds(30)))
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
