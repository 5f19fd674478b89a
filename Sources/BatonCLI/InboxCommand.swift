import ArgumentParser
import Baton
import BatonCommandSupport
import BatonDatabase
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

struct InboxCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "inbox",
        abstract: "Store, wait for, list and claim messages handed between an app and its extensions.",
        subcommands: [Put.self, Get.self, List.self, Claim.self]
    )

    typealias InboxOptions = BatonCommandSupport.InboxOptions

    struct Put: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Store a message (a known id is ignored) and ring the inbox signal. Prints `stored ID` or `duplicate ID`.")
        @OptionGroup var options: InboxOptions
        @Argument(help: "The message id (a call id, a payment hash).") var id: String
        @Argument(help: "The payload, as text.") var payload: String
        @Option(help: "Seconds to keep it (default 300).", transform: ArgumentCheck.seconds) var lifetime: Double?

        func run() async throws {
            let inbox = try await options.open()
            let inserted = try await inbox.store(IncomingMessage(id: id, payload: Data(payload.utf8), lifetime: lifetime))
            emit("\(inserted ? "stored" : "duplicate") \(id)")
        }
    }

    struct Get: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a message's payload, waiting for another process to store it. Exits 3 on timeout.")
        @OptionGroup var options: InboxOptions
        @Argument(help: "The message id.") var id: String
        @Option(help: "Give up after this many seconds (default: wait forever).", transform: ArgumentCheck.seconds) var timeout: Double?

        func run() async throws {
            let inbox = try await options.open(configuration: InboxConfiguration(timeoutMargin: .zero))
            let deadline = try Deadline.option(timeout)
            switch try await inbox.message(id: id, deadline: deadline, source: nil) {
            case .message(let message, _):
                emit(String(decoding: message.payload, as: UTF8.self))
            case .timedOut:
                throw CommandOutcome.timedOut("no message \(id) stored", after: timeout)
            }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the stored messages (ids, sizes, times; not payloads).")
        @OptionGroup var options: InboxOptions
        @Flag(help: "JSON: an array of {id, bytes, received_at, expires_at, shown_by, shown_at}.") var json = false

        func run() async throws {
            let messages = try await options.open().messages()
            if json {
                emit(try jsonLine(JSONValue.array(messages.map(InboxCommand.json))))
            } else {
                for message in messages {
                    emit("\(message.id)\t\(message.payload.count) bytes\treceived \(iso8601(message.receivedAt))\texpires \(iso8601(message.expiresAt))\t\(message.shownAt.map { "shown \(iso8601($0)) by \(message.shownBy ?? "?")" } ?? "not shown")")
                }
            }
        }
    }

    struct Claim: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Claim a message for display: prints `claimed ID` (exit 0) for exactly one caller across all processes, `not-claimed ID` (exit 1) otherwise.")
        @OptionGroup var options: InboxOptions
        @Argument(help: "The message id.") var id: String
        @Option(help: "Who shows it (default: the process kind and pid).") var by: String?

        func run() async throws {
            let claimed = try await options.open().claimForDisplay(id: id, by: by)
            emit("\(claimed ? "claimed" : "not-claimed") \(id)")
            if !claimed { throw CommandOutcome(.absent, "not claimed: message \(id) is claimed by another caller or is not stored") }
        }
    }

    static func json(_ message: InboxMessage) -> JSONValue {
        .object([
            "id": .string(message.id),
            "bytes": .int(message.payload.count),
            "received_at": .string(iso8601(message.receivedAt)),
            "expires_at": .string(iso8601(message.expiresAt)),
            "shown_by": message.shownBy.map { .string($0) } ?? .null,
            "shown_at": message.shownAt.map { .string(iso8601($0)) } ?? .null,
        ])
    }
}
