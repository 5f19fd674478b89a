import ArgumentParser
import Baton
import BatonCommandSupport
import BatonSimulator
import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

struct DefaultsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "defaults",
        abstract: "Read, write and watch shared defaults (a crash-safe key-value store shared by processes).",
        subcommands: [
            SetValue.self, Get.self, Remove.self, List.self, Watch.self, Verify.self, Acknowledge.self,
        ]
    )

    typealias SuiteOptions = DefaultsSuiteOptions

    enum ValueType: String, ExpressibleByArgument, CaseIterable {
        case string, int, double, bool, json
    }

    struct SetValue: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "set", abstract: "Set KEY to VALUE.")
        @OptionGroup var options: SuiteOptions
        @Argument(help: "The key (1 byte to 1 KiB).") var key: String
        @Argument(help: "The value.") var value: String
        @Option(help: "How to read VALUE: string, int, double, bool or json.") var type: ValueType = .string

        func run() async throws {
            let defaults = try options.open()
            switch type {
            case .string: try defaults.set(value, forKey: key)
            case .int:
                guard let number = Int(value) else { throw ValidationError("\(value) is not an integer") }
                try defaults.set(number, forKey: key)
            case .double:
                guard let number = Double(value) else { throw ValidationError("\(value) is not a number") }
                try defaults.set(number, forKey: key)
            case .bool:
                switch value.lowercased() {
                case "true", "yes", "1": try defaults.set(true, forKey: key)
                case "false", "no", "0": try defaults.set(false, forKey: key)
                default: throw ValidationError("\(value) is not a Boolean (true/false)")
                }
            case .json:
                let parsed: AnyJSON
                do { parsed = try JSONDecoder().decode(AnyJSON.self, from: Data(value.utf8)) } catch {
                    throw ValidationError("the value is \(describeDecodingError(error)) (pass JSON text, e.g. '{\"a\": 1}' or '\"text\"')")
                }
                try defaults.set(parsed, forKey: key)
            }
        }
    }

    struct Get: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the value of KEY; exit 1 (and say so on standard error) when it is absent.")
        @OptionGroup var options: SuiteOptions
        @Argument(help: "The key.") var key: String

        func run() async throws {
            guard try options.exists() else {
                throw CommandOutcome(.absent, "absent: \(key) is not set (suite \(options.suite) has no values)")
            }
            guard let value = try options.open().storedValue(forKey: key) else {
                throw CommandOutcome(.absent, "absent: \(key) is not set in suite \(options.suite)")
            }
            emit(render(value))
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove KEY.")
        @OptionGroup var options: SuiteOptions
        @Argument(help: "The key.") var key: String

        func run() async throws { try options.open().removeValue(forKey: key) }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print every key and value (KEY=VALUE lines, or one JSON object with --json).")
        @OptionGroup var options: SuiteOptions
        @Flag(help: "Print one JSON object, key to value.") var json = false

        func run() async throws {
            let values = try options.exists() ? try options.open().dictionaryRepresentation() : [:]
            if json {
                emit(try jsonLine(values.mapValues(jsonValue)))
            } else {
                for key in values.keys.sorted() { emit("\(key)=\(render(values[key]!))") }
            }
        }
    }

    struct Watch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a line per change of KEY in any process (KEY=VALUE, or 'KEY removed'). Exits 0 after --count changes, 3 on timeout.")
        @OptionGroup var options: SuiteOptions
        @Argument(help: "The key.") var key: String
        @Option(help: "Exit after this many changes.", transform: ArgumentCheck.count) var count: Int?
        @Option(help: "Exit with status 3 after this many seconds without finishing.", transform: ArgumentCheck.seconds) var timeout: Double?
        @Flag(help: "Print 'ready' once watching (for scripts and tests).") var announce = false

        func run() async throws {
            let defaults = try options.open()
            let changes = try defaults.changes(forKey: key)
            try await watchLoop(
                announce: announce, count: count, timeout: timeout,
                timedOut: { "\(key) in suite \(options.suite) changed \($0) times" },
                next: { try await changes.next(deadline: $0) },
                show: { changed in
                    if let value = try defaults.storedValue(forKey: changed) {
                        emit("\(changed)=\(render(value))")
                    } else {
                        emit("\(changed) removed")
                    }
                })
        }
    }

    struct Verify: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check every record's checksum; print the recovery report as JSON. Exits 6 when data was lost to corruption, 66 when the suite does not exist.")
        @OptionGroup var options: SuiteOptions

        func run() async throws {
            guard try options.exists() else {
                throw CommandOutcome(.notFound, "not found: suite \(options.suite) has no files in this container")
            }
            let report = try options.open().verify()
            emit(try jsonLine(JSONValue.object([
                "clean": .bool(report.isClean),
                "lost_data": .bool(report.lostData),
                "corrupt_bytes": .int(report.corruptBytes),
                "corrupt_regions": .int(report.corruptRegions),
                "dropped_tail_bytes": .int(report.droppedTailBytes),
                "crash_repairs": .int(report.crashRepairs),
                "losses": .array(report.losses.map { .string($0.description) }),
                "report": .string(report.description),
            ])))
            if report.lostData { throw CommandOutcome(.damaged, "damaged: suite \(options.suite) lost data to corruption (\(report.corruptBytes) bytes)") }
        }
    }

    struct Acknowledge: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Repair what is pending, then forget the recorded losses (verify is clean again); prints what was acknowledged. Quarantine files are kept.")
        @OptionGroup var options: SuiteOptions

        func run() async throws {
            let report = try options.open().acknowledgeRecovery()
            for loss in report.losses { emit("acknowledged: \(loss)") }
            emit(report.isClean ? "nothing to acknowledge" : "acknowledged")
        }
    }
}

/// Any JSON value, for `--type json` and `list --json`.
enum AnyJSON: Codable, Sendable {
    case null, bool(Bool), number(Double), integer(Int), string(String), array([AnyJSON]), object([String: AnyJSON])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let value = try? container.decode(Bool.self) { self = .bool(value) }
        else if let value = try? container.decode(Int.self) { self = .integer(value) }
        else if let value = try? container.decode(Double.self) { self = .number(value) }
        else if let value = try? container.decode(String.self) { self = .string(value) }
        else if let value = try? container.decode([AnyJSON].self) { self = .array(value) }
        else { self = .object(try container.decode([String: AnyJSON].self)) }
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .integer(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }
}

/// A value as the command line prints it: strings as they are, JSON as JSON, data in base64,
/// dates in ISO 8601.
func render(_ value: DefaultsValue) -> String {
    switch value {
    case .bool(let value): return value ? "true" : "false"
    case .int(let value): return String(value)
    case .double(let value): return "\(value)"
    case .string(let value): return value
    case .data(let bytes): return Data(bytes).base64EncodedString()
    case .date(let value): return value.formatted(.iso8601)
    case .json(let bytes): return String(decoding: bytes, as: UTF8.self)
    }
}

private func jsonValue(_ value: DefaultsValue) -> AnyJSON {
    switch value {
    case .bool(let value): return .bool(value)
    case .int(let value): return .integer(value)
    case .double(let value): return .number(value)
    case .string(let value): return .string(value)
    case .data(let bytes): return .string(Data(bytes).base64EncodedString())
    case .date(let value): return .string(value.formatted(.iso8601))
    case .json(let bytes): return (try? JSONDecoder().decode(AnyJSON.self, from: Data(bytes))) ?? .string(String(decoding: bytes, as: UTF8.self))
    }
}
