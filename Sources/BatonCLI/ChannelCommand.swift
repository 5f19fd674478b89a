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

struct ChannelCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "channel",
        abstract: "Send, receive and close cross-process channels.",
        subcommands: [Send.self, Receive.self, Close.self]
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
