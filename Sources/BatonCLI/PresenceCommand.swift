import ArgumentParser
import Baton
import BatonCommandSupport
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

struct PresenceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "presence",
        abstract: "Register this process, or list the live ones.",
        subcommands: [Hold.self, List.self]
    )

    struct Hold: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Register and hold until SIGTERM or SIGINT.")
        @OptionGroup var options: ContainerOptions
        @Option(help: "What this process is (app, extension, ...).") var kind: String

        func run() async throws {
            TerminationSignal.prepare()
            let container = try options.open()
            let registration = try container.presence.register(kind: kind)
            emit("registered id=\(registration.record.id) pid=\(registration.record.pid)")
            await TerminationSignal.wait()
            registration.release()
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the live processes.")
        @OptionGroup var options: ContainerOptions
        @Flag(help: "JSON: an array of {kind, pid, since}.") var json = false

        func run() async throws {
            let scan = try options.open().presence.scan()
            let records = scan.records
            for entry in scan.skipped {
                FileHandleOutput.standardError("skipped presence/\(entry.name): \(entry.reason)")
            }
            if json {
                emit(try jsonLine(JSONValue.array(records.map { JSONValue.object(["kind": .string($0.kind), "pid": .int(Int($0.pid)), "since": .string(iso8601($0.since)), "id": .string($0.id)]) })))
            } else {
                for record in records {
                    emit("\(record.pid)\t\(record.kind)\t\(iso8601(record.since))")
                }
            }
        }
    }
}

func iso8601(_ date: Date) -> String {
    date.formatted(.iso8601)
}
