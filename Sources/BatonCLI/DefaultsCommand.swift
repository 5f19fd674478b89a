import ArgumentParser
import Baton
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
            TestWriter.self, TestReader.self, TestIncrement.self, TestBigWriter.self, TestCheckBig.self, TestFill.self, TestDieMidWrite.self,
        ]
    )

    struct SuiteOptions: ParsableArguments {
        @OptionGroup var container: ContainerOptions
        @Option(help: "The suite: a group of keys with its own files.") var suite = "standard"

        /// Whether the suite has files yet, checked without creating anything (reading a suite
        /// that was never written must not create it).
        func exists() throws -> Bool {
            let container = try self.container.open()
            try SharedContainer.validateName(suite, what: "a defaults suite name")
            var info = stat()
            return lstat(container.batonPath + "/defaults/\(suite).meta", &info) == 0
        }

        func open() throws -> SharedDefaults {
            let defaults = try SharedDefaults(container.open(), suite: suite)
            let report = defaults.recoveryReport
            if !report.isClean { FileHandleOutput.standardError("warning: defaults suite \(suite): \(report)") }
            return defaults
        }
    }

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
            if announce { emit("ready") }
            let deadline = try Deadline.option(timeout)
            var seen = 0
            while count.map({ seen < $0 }) ?? true {
                do {
                    let changed = try await changes.next(deadline: deadline)
                    seen += 1
                    if let value = try defaults.storedValue(forKey: changed) {
                        emit("\(changed)=\(render(value))")
                    } else {
                        emit("\(changed) removed")
                    }
                } catch let error as BatonError where error.code == .timedOut {
                    throw CommandOutcome.timedOut("\(key) in suite \(options.suite) changed \(seen) times\(count.map { " of \($0) expected" } ?? "")", after: timeout)
                }
            }
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

    // MARK: - Test workers (hidden)

    /// Writes `w:seq:pattern` values to keys k0..k(N-1) round-robin for a while, then prints
    /// `last KEY SEQ` for each key and `done`.
    struct TestWriter: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "test-writer", shouldDisplay: false)
        @OptionGroup var options: SuiteOptions
        @Option var name: String
        @Option(transform: ArgumentCheck.positiveCount) var keys: Int = 50
        @Option(transform: ArgumentCheck.seconds) var seconds: Double = 5.0
        @Option(help: "Sleep this long after each set (a daemon writing now and then).", transform: ArgumentCheck.count) var pauseMicroseconds: Int = 0

        func run() async throws {
            let defaults = try options.open()
            let end = baton_monotonic_ns() + UInt64(seconds * 1e9)
            var sequence = 0
            var last = [Int](repeating: -1, count: keys)
            emit("ready")
            while baton_monotonic_ns() < end {
                for index in 0..<keys {
                    sequence += 1
                    try defaults.set(TestValue.make(writer: name, sequence: sequence), forKey: "k\(index)")
                    last[index] = sequence
                    if pauseMicroseconds > 0 { usleep(UInt32(min(pauseMicroseconds, 1_000_000))) }
                }
            }
            for index in 0..<keys { emit("last k\(index) \(last[index])") }
            emit("done \(sequence)")
        }
    }

    /// Reads k0..k(N-1) in a loop; checks every value is whole and that no writer's sequence
    /// goes backwards for a key. Prints `ok READS` or `bad ...` and exits when stdin-free time ends.
    struct TestReader: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "test-reader", shouldDisplay: false)
        @OptionGroup var options: SuiteOptions
        @Option(transform: ArgumentCheck.positiveCount) var keys: Int = 50
        @Option(transform: ArgumentCheck.seconds) var seconds: Double = 5.0

        func run() async throws {
            let defaults = try options.open()
            let end = baton_monotonic_ns() + UInt64(seconds * 1e9)
            var highest: [String: Int] = [:]
            var reads = 0
            emit("ready")
            while baton_monotonic_ns() < end {
                for index in 0..<keys {
                    guard let value = defaults.string(forKey: "k\(index)") else { continue }
                    reads += 1
                    guard let (writer, sequence) = TestValue.check(value) else {
                        emit("bad torn value for k\(index) (\(value.utf8.count) bytes)")
                        throw ExitCode(2)
                    }
                    let slot = "k\(index)/\(writer)"
                    if let previous = highest[slot], previous > sequence {
                        emit("bad k\(index) went back from \(writer):\(previous) to \(writer):\(sequence)")
                        throw ExitCode(2)
                    }
                    highest[slot] = sequence
                }
            }
            emit("ok \(reads)")
        }
    }

    /// Increments KEY COUNT times with compare-and-set.
    struct TestIncrement: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "test-increment", shouldDisplay: false)
        @OptionGroup var options: SuiteOptions
        @Option var key = "counter"
        @Option(transform: ArgumentCheck.count) var count: Int = 1000
        @Flag(help: "Print 'ready', then start when the key 'go' is set (so that all workers overlap).") var waitForGo = false

        func run() async throws {
            let defaults = try options.open()
            if waitForGo {
                let go = try defaults.changes(forKey: "go")
                emit("ready")
                while defaults.bool(forKey: "go") != true { _ = try await go.next(deadline: .seconds(60)) }
            }
            var retries = 0
            for _ in 0..<count {
                while true {
                    let current = defaults.integer(forKey: key)
                    if try defaults.compareAndSet(key, expected: current, new: (current ?? 0) + 1) { break }
                    retries += 1
                }
            }
            emit("done retries=\(retries)")
        }
    }

    /// Writes large self-checking values to KEY forever, printing `wrote SEQ` after each.
    struct TestBigWriter: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "test-big-writer", shouldDisplay: false)
        @OptionGroup var options: SuiteOptions
        @Option var key = "big"
        @Option(transform: ArgumentCheck.count) var size: Int = 1 << 20

        func run() async throws {
            let defaults = try options.open()
            emit("ready")
            var sequence = 0
            while true {
                sequence += 1
                try defaults.set(TestValue.big(sequence: sequence, size: size), forKey: key)
                emit("wrote \(sequence)")
            }
        }
    }

    /// Checks the big value of KEY: prints `ok SEQ`, `absent`, or `bad`.
    struct TestCheckBig: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "test-check-big", shouldDisplay: false)
        @OptionGroup var options: SuiteOptions
        @Option var key = "big"

        func run() async throws {
            let defaults = try options.open()
            emit("report \(defaults.recoveryReport.isClean ? "clean" : defaults.recoveryReport.description)")
            guard let value = defaults.data(forKey: key) else { emit("absent"); return }
            if let sequence = TestValue.checkBig(Array(value)) { emit("ok \(sequence)") } else { emit("bad"); throw ExitCode(2) }
        }
    }

    /// Lowers the file-size limit to BYTES, then tries to write a value that needs more room.
    struct TestFill: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "test-fill", shouldDisplay: false)
        @OptionGroup var options: SuiteOptions
        @Option var key = "big"
        @Option(transform: ArgumentCheck.count) var limit: Int = 300_000
        @Option(transform: ArgumentCheck.count) var size: Int = 1 << 20

        func run() async throws {
            let defaults = try options.open()
            signal(SIGXFSZ, SIG_IGN)
            var limits = rlimit(rlim_cur: rlim_t(limit), rlim_max: rlim_t(limit))
            guard setrlimit(Int32(RLIMIT_FSIZE.rawValue), &limits) == 0 else { throw ExitCode(4) }
            do {
                try defaults.set(Data(repeating: 7, count: size), forKey: key)
                emit("written")
            } catch let error as BatonError {
                emit("error \(error.code)")
            }
        }
    }
}

extension DefaultsCommand {
    /// Simulates a writer killed in the middle of an append: takes the suite's writer lock the
    /// way the store does, writes half a record past the committed end, announces the pending
    /// end, and SIGKILLs itself while holding the lock.
    struct TestDieMidWrite: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "test-die-mid-write", shouldDisplay: false)
        @OptionGroup var options: SuiteOptions

        func run() async throws {
            let defaults = try options.open() // creates the files
            _ = defaults.allKeys
            let container = try options.container.open()
            let meta = try MappedFile(container, relativePath: "defaults/\(options.suite).meta", minimumSize: 4096)
            let log = try MappedFile(container, relativePath: "defaults/\(options.suite).log", minimumSize: 0, create: false)
            let token = try container.owners.enter()
            guard SharedMutex(meta.pointer + 64).lock(as: token, tokens: container.owners, deadline: .now + .seconds(5), keepAlive: meta) != nil else {
                throw ExitCode(4)
            }
            let committed = baton_load64(meta.pointer.advanced(by: 128).assumingMemoryBound(to: UInt64.self))
            let length = Int(committed & ((1 << 40) - 1))
            let torn = 4096
            guard length + torn <= log.size else { throw ExitCode(5) }
            // A record header that promises more than was written, then some payload.
            log.pointer.storeBytes(of: UInt32(torn * 2), toByteOffset: length, as: UInt32.self)
            log.pointer.storeBytes(of: UInt32(0xDEAD_BEEF), toByteOffset: length + 4, as: UInt32.self)
            (log.pointer + length + 8).initializeMemory(as: UInt8.self, repeating: 0x5A, count: torn - 8)
            baton_store64(meta.pointer.advanced(by: 136).assumingMemoryBound(to: UInt64.self), UInt64(length + torn * 2 + 8))
            emit("holding")
            kill(getpid(), SIGKILL)
        }
    }
}

/// Self-checking test values.
enum TestValue {
    /// `writer:sequence:` followed by a pattern whose length and letters depend on the sequence.
    static func make(writer: String, sequence: Int) -> String {
        let letter = Character(UnicodeScalar(UInt8(97 + sequence % 26)))
        return "\(writer):\(sequence):" + String(repeating: letter, count: 16 + sequence % 97)
    }

    static func check(_ value: String) -> (String, Int)? {
        let parts = value.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, let sequence = Int(parts[1]) else { return nil }
        guard make(writer: String(parts[0]), sequence: sequence) == value else { return nil }
        return (String(parts[0]), sequence)
    }

    /// 8 bytes of sequence, then bytes derived from it, then its CRC.
    static func big(sequence: Int, size: Int) -> Data {
        var bytes = [UInt8](repeating: 0, count: size)
        withUnsafeBytes(of: UInt64(sequence).littleEndian) { for index in 0..<8 { bytes[index] = $0[index] } }
        for index in 8..<(size - 4) { bytes[index] = UInt8(truncatingIfNeeded: index &* 31 &+ sequence) }
        let crc = bytes.withUnsafeBytes { baton_crc32c(0, $0.baseAddress!, size - 4) }
        withUnsafeBytes(of: crc.littleEndian) { for index in 0..<4 { bytes[size - 4 + index] = $0[index] } }
        return Data(bytes)
    }

    static func checkBig(_ bytes: [UInt8]) -> Int? {
        guard bytes.count > 12 else { return nil }
        let sequence = bytes.withUnsafeBytes { Int(UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self))) }
        let expected = big(sequence: sequence, size: bytes.count)
        return Array(expected) == bytes ? sequence : nil
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
