import ArgumentParser
import Baton
import BatonCommandSupport
import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// `baton-harness defaults ...`: the defaults tests' worker processes.
struct DefaultsWorkers: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "defaults",
        abstract: "Defaults test workers: writers, readers, incrementers, big values, a full disk, a death mid-write.",
        subcommands: [TestWriter.self, TestReader.self, TestIncrement.self, TestBigWriter.self, TestCheckBig.self, TestFill.self, TestDieMidWrite.self]
    )

    typealias SuiteOptions = DefaultsSuiteOptions

    /// Writes `w:seq:pattern` values to keys k0..k(N-1) round-robin for a while, then prints
    /// `last KEY SEQ` for each key and `done`.
    struct TestWriter: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "test-writer")
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
        static let configuration = CommandConfiguration(commandName: "test-reader")
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
        static let configuration = CommandConfiguration(commandName: "test-increment")
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
        static let configuration = CommandConfiguration(commandName: "test-big-writer")
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
        static let configuration = CommandConfiguration(commandName: "test-check-big")
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
        static let configuration = CommandConfiguration(commandName: "test-fill")
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

extension DefaultsWorkers {
    /// Simulates a writer killed in the middle of an append: takes the suite's writer lock the
    /// way the store does, writes half a record past the committed end, announces the pending
    /// end, and SIGKILLs itself while holding the lock.
    struct TestDieMidWrite: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "test-die-mid-write")
        @OptionGroup var options: SuiteOptions

        func run() async throws {
            let defaults = try options.open() // creates the files
            _ = defaults.allKeys
            let container = try options.container.open()
            let meta = try MappedFile(container, relativePath: "defaults/\(options.suite).meta", minimumSize: 4096)
            let log = try MappedFile(container, relativePath: "defaults/\(options.suite).log", minimumSize: 0, create: false)
            let token = try container.owners.enter()
            guard SharedMutex(meta.pointer + 64).lock(as: token, tokens: container.owners, deadline: .after(.seconds(5)), keepAlive: meta) != nil else {
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
