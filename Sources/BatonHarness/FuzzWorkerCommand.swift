import CBatonShims
import ArgumentParser
import Baton
import BatonCommandSupport
import BatonDatabase
import BatonSimulator
import Synchronization
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `baton-harness test-fuzz`: applies seeded corruptions to one on-disk format, in this process,
/// and checks what Baton does next (the corruption fuzzer of `CorruptionFuzzTests`).
///
/// For each mutation: a fresh container under `--container` is filled through the library, one
/// of its files is corrupted (a bit flip, a forged word at a header offset, truncation,
/// extension, zeroing, or the file swapped for a directory, a FIFO or a symbolic link), then
/// the format is used again with deadlines: by a fresh `SharedContainer` (`stopped`: the
/// writers are gone) or first by the objects that were open during the corruption (`running`).
/// One line per mutation: `result <format> <index> <mode> <mutation> <outcome> <detail>`, where
/// outcome is `typed` (an error was thrown), `recovered` (everything worked and the acknowledged
/// data is intact) or `loss` (acknowledged data silently missing or rolled back). A mutation that
/// runs past ``hangLimit`` prints `hang <index>` and exits 3; a crash kills the worker, and the
/// last `begin <index>` line names the mutation (replay with `--first`).
struct FuzzWorkerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "test-fuzz", abstract: "Corruption fuzzer worker.")

    @OptionGroup var options: ContainerOptions
    @Option(help: "The format to corrupt.") var format: FuzzFormat
    @Option(help: "The seed (each mutation's generator derives from it and the index).") var seed: UInt64
    @Option(help: "How many mutations.", transform: ArgumentCheck.count) var count: Int = 200
    @Option(help: "The index of the first mutation (to replay one).", transform: ArgumentCheck.count) var first: Int = 0
    @Option(help: "stopped, running, or mixed (alternating).") var mode: FuzzMode = .mixed

    /// How long one mutation with its checks may take.
    static let hangLimit: Duration = .seconds(20)

    func run() async throws {
        guard let root = options.container ?? environment("BATON_CONTAINER") else {
            throw ValidationError("no container: pass --container DIR or set BATON_CONTAINER")
        }
        let watchdog = FuzzWatchdog()
        watchdog.start()
        var counts: [String: Int] = [:]
        for index in first..<(first + count) {
            var generator = SeededGenerator(seed: seed ^ (UInt64(index) &* 0x9E37_79B9_7F4A_7C15) ^ format.salt)
            let running = mode == .running || (mode == .mixed && index % 2 == 1)
            emit("begin \(index)")
            watchdog.begin(index)
            let directory = root + "/m\(index)"
            _ = mkdir(directory, 0o700)
            let outcome: FuzzOutcome
            let mutation: FuzzMutation?
            do {
                (mutation, outcome) = try await FuzzCase(format: format, path: directory, running: running).run(&generator)
            } catch {
                (mutation, outcome) = (nil, .typed("setup failed: \(error)"))
            }
            try? FileManager.default.removeItem(atPath: directory)
            watchdog.end()
            counts[outcome.name, default: 0] += 1
            emit("result \(format.rawValue) \(index) \(running ? "running" : "stopped") \(mutation?.description ?? "none") \(outcome.name) \(outcome.detail.replacingOccurrences(of: "\n", with: " "))")
        }
        emit("summary \(format.rawValue) mutations=\(count) typed=\(counts["typed", default: 0]) recovered=\(counts["recovered", default: 0]) loss=\(counts["loss", default: 0])")
    }
}

enum FuzzMode: String, ExpressibleByArgument, Sendable { case stopped, running, mixed }

/// The on-disk formats, each with the files to corrupt (relative to `.baton`).
enum FuzzFormat: String, ExpressibleByArgument, CaseIterable, Sendable {
    case signals, defaultsLog = "defaults-log", defaultsMeta = "defaults-meta", role, writerQueue = "writer-queue"
    case channel, presence, ownerTokens = "owner-tokens"

    var salt: UInt64 { UInt64(Self.allCases.firstIndex(of: self)!) << 56 }

    /// Header (and record) offsets worth forging, for a file of `bytes`.
    func offsets(_ bytes: [UInt8]) -> [Int] {
        func word32(_ offset: Int) -> Int { offset + 4 <= bytes.count ? Int(bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset, as: UInt32.self) }) : 0 }
        switch self {
        case .signals:
            var result = [0, 8, 12, 16, 20, 24, 64, 128] + (0..<4).flatMap { entry in [0, 4, 8, 16, 24].map { 1024 + entry * 32 + $0 } }
            for slot in 0..<4096 where 4096 + slot * 256 + 4 <= bytes.count && word32(4096 + slot * 256) != 0 {
                result += [0, 4, 8, 16, 24, 32, 36, 40].map { 4096 + slot * 256 + $0 }
            }
            return result
        case .defaultsLog:
            var result = [0, 8, 16, 24]
            var offset = 64
            while offset + 8 <= bytes.count, case let length = word32(offset), length > 0, length < bytes.count {
                result += [offset, offset + 4, offset + 8, offset + 10, offset + 12]
                offset += 8 + ((length + 7) & ~7)
            }
            return result
        case .defaultsMeta:
            // Magic, version, boot id, the writer lock, committed, pending end, watchers.
            return [0, 4, 8, 16, 24, 56, 64, 68, 72, 76, 80, 128, 132, 136, 140, 144]
        case .presence, .ownerTokens:
            return Array(stride(from: 0, to: max(bytes.count, 8), by: 4))
        case .role:
            return [0, 2560].flatMap { slot in stride(from: 0, to: 256, by: 4).map { slot + $0 } + [slot + 2556] }
        case .writerQueue:
            return [0, 8, 64, 128, 256, 264, 320, 324, 328, 336, 344, 352, 360] + (0..<6).flatMap { slot in [0, 4, 8, 16, 20].map { 4096 + slot * 64 + $0 } }
        case .channel:
            var result = [0, 8, 12, 16, 24, 64, 68, 72, 128, 132, 136, 140, 144, 152, 160, 168, 176, 184, 200, 208, 216, 224, 1024, 1032]
            result += stride(from: 4032, to: 4096, by: 4) // the seal
            result += stride(from: 4096, to: min(bytes.count, 4096 + 512), by: 4)
            return result
        }
    }

    /// The files of this format under `.baton` in `container`.
    func files(_ baton: String) -> [String] {
        func listed(_ directory: String, _ keep: (String) -> Bool = { _ in true }) -> [String] {
            ((try? FileManager.default.contentsOfDirectory(atPath: baton + "/" + directory)) ?? [])
                .filter { !$0.hasPrefix(".") && keep($0) }.sorted().map { directory + "/" + $0 }
        }
        switch self {
        case .signals: return ["signals"]
        case .defaultsLog: return listed("defaults") { $0.hasSuffix(".log") }
        case .defaultsMeta: return listed("defaults") { !$0.hasSuffix(".log") && !$0.hasSuffix(".lock") }
        case .role: return ["roles/fuzz/record"]
        case .writerQueue: return ["fuzz.queue"]
        case .channel: return ["channels/fuzz"]
        case .presence: return listed("presence")
        case .ownerTokens: return listed("owners")
        }
    }
}

/// One corruption of a file.
enum FuzzMutation: CustomStringConvertible {
    case flip(file: String, offset: Int, bit: Int)
    case word32(file: String, offset: Int, value: UInt32)
    case word64(file: String, offset: Int, value: UInt64)
    case truncate(file: String, size: Int)
    case extend(file: String, size: Int, byte: UInt8)
    case zero(file: String, offset: Int, length: Int)
    case directory(file: String)
    case fifo(file: String)
    case symlink(file: String)

    var description: String {
        switch self {
        case .flip(let file, let offset, let bit): "flip:\(file)@\(offset).\(bit)"
        case .word32(let file, let offset, let value): "word32:\(file)@\(offset)=\(value)"
        case .word64(let file, let offset, let value): "word64:\(file)@\(offset)=\(value)"
        case .truncate(let file, let size): "truncate:\(file)@\(size)"
        case .extend(let file, let size, let byte): "extend:\(file)@\(size)x\(byte)"
        case .zero(let file, let offset, let length): "zero:\(file)@\(offset)+\(length)"
        case .directory(let file): "directory:\(file)"
        case .fifo(let file): "fifo:\(file)"
        case .symlink(let file): "symlink:\(file)"
        }
    }

    var truncatesToNothing: Bool {
        if case .truncate(_, 0) = self { return true }
        return false
    }

    var replacesFile: Bool {
        switch self {
        case .directory, .fifo, .symlink: true
        default: false
        }
    }

    /// Draws a mutation of `file` (relative to `baton`) of `format`.
    static func draw(_ format: FuzzFormat, baton: String, file: String, using generator: inout SeededGenerator) -> FuzzMutation {
        let bytes = (try? Array(Data(contentsOf: URL(fileURLWithPath: baton + "/" + file)))) ?? []
        let size = bytes.count
        let offsets = format.offsets(bytes)
        func offset(_ width: Int) -> Int {
            if !offsets.isEmpty, Bool.random(using: &generator) || size < width { return offsets.randomElement(using: &generator)! }
            return Int.random(in: 0...max(0, size - width), using: &generator)
        }
        let forged32: [UInt32] = [0, 1, 2, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, UInt32(truncatingIfNeeded: size), UInt32(truncatingIfNeeded: size + 8), UInt32.random(in: 0...UInt32.max, using: &generator)]
        let forged64: [UInt64] = [0, 1, 0x7FFF_FFFF_FFFF_FFFF, UInt64.max, 1 << 40, UInt64(size), UInt64(size) << 32 | 1, UInt64.random(in: 0...UInt64.max, using: &generator)]
        let roll = Int.random(in: 0..<100, using: &generator)
        switch roll {
        case 0..<30: return .flip(file: file, offset: offset(1), bit: Int.random(in: 0..<8, using: &generator))
        case 30..<45: return .word32(file: file, offset: offset(4), value: forged32.randomElement(using: &generator)!)
        case 45..<58:
            let at = offset(8)
            // Also plausible neighbours of the current value (an older or newer length, another
            // generation), which no magic check catches.
            let current = at + 8 <= size ? bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: at, as: UInt64.self)) } : 0
            let near: [UInt64] = [current &- 8, current &- 32, current &+ 32, current ^ (1 << 40), current / 2]
            return .word64(file: file, offset: at, value: (forged64 + near).randomElement(using: &generator)!)
        case 58..<68: return .truncate(file: file, size: [0, 1, 7, 24, 64, 100, 4095, 4096, size / 2, max(0, size - 1)].randomElement(using: &generator)!)
        case 68..<76: return .extend(file: file, size: size + [1, 8, 4096, 65536].randomElement(using: &generator)!, byte: [0, 0xFF, 0x41].randomElement(using: &generator)!)
        case 76..<86:
            let start = offset(1)
            return .zero(file: file, offset: start, length: [8, 64, 4096, size].randomElement(using: &generator)!)
        case 86..<90: return .directory(file: file)
        case 90..<95: return .fifo(file: file)
        default: return .symlink(file: file)
        }
    }

    /// Applies the corruption to the file under `baton` (`scratch` holds the symbolic link's target).
    func apply(baton: String, scratch: String) {
        func withFile(_ file: String, _ body: (Int32) -> Void) {
            let fd = open(baton + "/" + file, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            guard fd >= 0 else { return }
            body(fd)
            close(fd)
        }
        func write<T>(_ fd: Int32, _ value: T, at offset: Int) {
            var value = value
            _ = withUnsafeBytes(of: &value) { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
        }
        switch self {
        case .flip(let file, let offset, let bit):
            withFile(file) { fd in
                var byte: UInt8 = 0
                guard pread(fd, &byte, 1, off_t(offset)) == 1 else { return }
                byte ^= 1 << UInt8(bit)
                write(fd, byte, at: offset)
            }
        case .word32(let file, let offset, let value): withFile(file) { write($0, value.littleEndian, at: offset) }
        case .word64(let file, let offset, let value): withFile(file) { write($0, value.littleEndian, at: offset) }
        case .truncate(let file, let size): withFile(file) { _ = ftruncate($0, off_t(size)) }
        case .extend(let file, let size, let byte):
            withFile(file) { fd in
                var info = stat()
                guard fstat(fd, &info) == 0, Int(info.st_size) < size else { return }
                let tail = [UInt8](repeating: byte, count: size - Int(info.st_size))
                _ = tail.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, info.st_size) }
            }
        case .zero(let file, let offset, let length):
            withFile(file) { fd in
                let zeros = [UInt8](repeating: 0, count: length)
                _ = zeros.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
            }
        case .directory(let file):
            unlink(baton + "/" + file)
            mkdir(baton + "/" + file, 0o700)
        case .fifo(let file):
            unlink(baton + "/" + file)
            mkfifo(baton + "/" + file, 0o600)
        case .symlink(let file):
            // A link to a copy of the file: the same bytes, reached through a link Baton must not follow.
            let twin = scratch + "/twin-" + file.replacingOccurrences(of: "/", with: "_")
            _ = try? FileManager.default.copyItem(atPath: baton + "/" + file, toPath: twin)
            unlink(baton + "/" + file)
            _ = Foundation.symlink(twin, baton + "/" + file)
        }
    }
}

enum FuzzOutcome {
    case typed(String)
    case recovered(String)
    case loss(String)

    var name: String {
        switch self {
        case .typed: "typed"
        case .recovered: "recovered"
        case .loss: "loss"
        }
    }

    var detail: String {
        switch self {
        case .typed(let text), .recovered(let text), .loss(let text): text
        }
    }
}

/// Kills the worker when one mutation runs past ``FuzzWorkerCommand/hangLimit``.
final class FuzzWatchdog: Sendable {
    private let current = Mutex<(index: Int, since: ContinuousClock.Instant)?>(nil)

    func start() {
        KernelThread.spawn(name: "baton-fuzz-watchdog") { [self] in
            while true {
                usleep(250_000)
                let late = current.withLock { state -> Int? in
                    guard let state, ContinuousClock.now - state.since > FuzzWorkerCommand.hangLimit else { return nil }
                    return state.index
                }
                if let late {
                    emit("hang \(late)")
                    _exit(3)
                }
            }
        }
    }

    func begin(_ index: Int) { current.withLock { $0 = (index, .now) } }
    func end() { current.withLock { $0 = nil } }
}

/// One mutation of one format: fill, corrupt, use again, judge.
struct FuzzCase {
    let format: FuzzFormat
    let path: String
    let running: Bool
    var baton: String { path + "/.baton" }

    /// How long each operation after the corruption may wait.
    static let patience = 1.5

    func deadline() throws -> Deadline { try .seconds(Self.patience) }

    func run(_ generator: inout SeededGenerator) async throws -> (FuzzMutation?, FuzzOutcome) {
        switch format {
        case .signals: return try await signals(&generator)
        case .defaultsLog, .defaultsMeta: return try await defaults(&generator)
        case .role: return try await role(&generator)
        case .writerQueue: return try await writerQueue(&generator)
        case .channel: return try await channel(&generator)
        case .presence: return try await presence(&generator)
        case .ownerTokens: return try await ownerTokens(&generator)
        }
    }

    func open() throws -> SharedContainer { try SharedContainer(path: path) }

    /// Draws and applies a mutation to one of the format's files.
    func mutate(_ generator: inout SeededGenerator) throws -> FuzzMutation {
        let files = format.files(baton)
        guard let file = files.randomElement(using: &generator) else { throw TestFailureText("no \(format.rawValue) file to corrupt") }
        let mutation = FuzzMutation.draw(format, baton: baton, file: file, using: &generator)
        mutation.apply(baton: baton, scratch: path)
        emit("mutation \(mutation)")
        return mutation
    }

    /// Runs `body`; a thrown error is the typed outcome.
    func judged(_ mutation: FuzzMutation, _ body: () async throws -> FuzzOutcome) async -> (FuzzMutation?, FuzzOutcome) {
        do { return (mutation, try await body()) } catch { return (mutation, .typed("\(error)")) }
    }

    // MARK: Formats

    func signals(_ generator: inout SeededGenerator) async throws -> (FuzzMutation?, FuzzOutcome) {
        var first: SharedContainer? = try open()
        try first!.signals.post("alpha", state: 7)
        var observation: SignalObservation? = try first!.signals.observe("alpha")
        if !running { (first, observation) = (nil, nil) }
        let mutation = try mutate(&generator)
        return await judged(mutation) {
            if let first, let observation {
                try first.signals.post("alpha", state: 8)
                _ = try await observation.next(deadline: try deadline())
            }
            let container = try open()
            let beta = try container.signals.observe("beta")
            try container.signals.post("beta", state: 3)
            let delivery = try await beta.next(deadline: try deadline())
            guard delivery.state == 3 else { return .loss("beta delivered state \(delivery.state), posted 3") }
            try container.signals.post("alpha", state: 9)
            let state = try container.signals.state(of: "alpha")
            guard state == 9 else { return .loss("alpha reads \(state) right after posting 9") }
            return .recovered("")
        }
    }

    func defaults(_ generator: inout SeededGenerator) async throws -> (FuzzMutation?, FuzzOutcome) {
        var acknowledged: [String: Int] = [:]
        var first: SharedDefaults? = try SharedDefaults(try open(), suite: "fuzz", lockTimeout: .seconds(Self.patience))
        // Each key written twice: a rollback to the older value is told apart from a loss.
        for round in 1...2 {
            for key in 0..<6 {
                try first!.set(key * 10 + round, forKey: "k\(key)")
                acknowledged["k\(key)"] = key * 10 + round
            }
        }
        if !running { first = nil }
        let mutation = try mutate(&generator)
        return await judged(mutation) {
            if let first {
                try first.set(70, forKey: "k7")
                acknowledged["k7"] = 70
                _ = try first.dictionaryRepresentation()
            }
            let defaults = try SharedDefaults(try open(), suite: "fuzz", lockTimeout: .seconds(Self.patience))
            let values = try defaults.dictionaryRepresentation()
            let report = try defaults.verify()
            let missing = acknowledged.keys.sorted().filter { values[$0] != .int(acknowledged[$0]!) }
            if !missing.isEmpty, !report.lostData, !defaults.recoveryReport.lostData {
                return .loss("acknowledged \(missing) missing or changed, report: \(report)")
            }
            try defaults.set(99, forKey: "after")
            guard defaults.integer(forKey: "after") == 99 else { return .loss("a value set after the corruption does not read back") }
            let reopened = try SharedDefaults(try open(), suite: "fuzz", lockTimeout: .seconds(Self.patience))
            guard reopened.integer(forKey: "after") == 99 else { return .loss("a value set after the corruption is gone in a new reader") }
            return .recovered(missing.isEmpty ? "" : "loss reported: \(report)")
        }
    }

    func role(_ generator: inout SeededGenerator) async throws -> (FuzzMutation?, FuzzOutcome) {
        var first: Role? = try open().role("fuzz")
        var acknowledged: UInt64 = 0
        for _ in 0..<3 {
            let lease = try await first!.acquire(priority: .main, deadline: try deadline())
            acknowledged = lease.epoch
            await lease.release()
        }
        if !running { first = nil }
        let mutation = try mutate(&generator)
        return await judged(mutation) {
            if let first {
                let lease = try await first.acquire(priority: .main, deadline: try deadline())
                guard lease.epoch > acknowledged else { return .loss("epoch \(lease.epoch) granted again after \(acknowledged)") }
                acknowledged = lease.epoch
                await lease.release()
            }
            let role = try open().role("fuzz")
            _ = try role.status()
            let lease = try await role.acquire(priority: .main, deadline: try deadline())
            defer { withExtendedLifetime(lease) {} }
            await lease.release()
            guard lease.epoch > acknowledged else { return .loss("epoch \(lease.epoch) granted after \(acknowledged) was acknowledged (fencing token reused)") }
            return .recovered("")
        }
    }

    func writerQueue(_ generator: inout SeededGenerator) async throws -> (FuzzMutation?, FuzzOutcome) {
        var first: TicketLock? = try TicketLock(try open(), name: "fuzz.queue")
        for _ in 0..<3 {
            let ticket = try first!.acquire(deadline: try deadline(), interruption: { nil })
            _ = first!.bumpSequence()
            first!.release(ticket)
        }
        if !running { first = nil }
        let mutation = try mutate(&generator)
        return await judged(mutation) {
            if let first {
                let ticket = try first.acquire(deadline: try deadline(), interruption: { nil })
                first.release(ticket)
            }
            let queue = try TicketLock(try open(), name: "fuzz.queue")
            let ticket = try queue.acquire(deadline: try deadline(), interruption: { nil })
            queue.release(ticket)
            return .recovered("")
        }
    }

    func channel(_ generator: inout SeededGenerator) async throws -> (FuzzMutation?, FuzzOutcome) {
        var first: SharedChannel<String>? = try SharedChannel<String>(try open(), existingOrNewNamed: "fuzz", capacity: .unbounded)
        let sent = (0..<6).map { "v\($0)" }
        for value in sent { try await first!.send(value, deadline: try deadline()) }
        guard try first!.tryReceive() == "v0" else { throw TestFailureText("v0 not received before the corruption") }
        if !running { first = nil }
        let mutation = try mutate(&generator)
        return await judged(mutation) {
            var received: [String] = []
            var malformed = 0
            func drain(_ channel: SharedChannel<String>) throws {
                for _ in 0..<20 {
                    do {
                        guard let value = try channel.tryReceive() else { return }
                        received.append(value)
                    } catch let error as BatonError where error.code == .malformedFrame {
                        malformed += 1
                    }
                }
            }
            if let first {
                try await first.send("v6", deadline: try deadline())
                try drain(first)
            }
            let channel = try SharedChannel<String>(try open(), existingOrNewNamed: "fuzz", capacity: .unbounded)
            try drain(channel)
            let expected = Array(sent.dropFirst()) + (first == nil ? [] : ["v6"])
            // Nothing that was never sent, nothing twice, nothing already received.
            if let stranger = received.first(where: { !expected.contains($0) }) { return .loss("received \(stranger), never sent (or already received)") }
            if Set(received).count != received.count { return .loss("received twice: \(received)") }
            try await channel.send("after", deadline: try deadline())
            var after: String?
            for _ in 0..<20 {
                do {
                    after = try channel.tryReceive()
                    if after == "after" || after == nil { break }
                } catch let error as BatonError where error.code == .malformedFrame {
                    malformed += 1
                }
            }
            guard after == "after" else { return .loss("a value sent after the corruption was not received (got \(after ?? "nothing"))") }
            let missing = expected.filter { !received.contains($0) }
            // A file cut to nothing is a new channel (nothing tells it from one just created).
            // (The head, tail and counts are sealed, frame states checked against the counts:
            // a forged word is put back or reported, like damage to checksummed bytes.)
            if !missing.isEmpty, malformed == 0, !mutation.truncatesToNothing {
                return .loss("acknowledged \(missing) never received, and no damaged frame reported")
            }
            return .recovered(missing.isEmpty ? "" : "missing \(missing) (malformed frames reported: \(malformed))")
        }
    }

    func presence(_ generator: inout SeededGenerator) async throws -> (FuzzMutation?, FuzzOutcome) {
        let first = try open()
        let registration = try first.presence.register(kind: "fuzz")
        let id = registration.record.id
        let mutation = try mutate(&generator)
        return await judged(mutation) {
            defer { registration.release() }
            let container = try open()
            let scan = try container.presence.scan()
            // The kernel still holds the live registration's lock: unless its file was replaced,
            // it is listed (its kind may be unreadable).
            if !mutation.replacesFile, !scan.records.contains(where: { $0.id == id || $0.kind == PresenceRecord.unknownKind }) {
                return .loss("a live registration is not listed: \(scan.records), skipped \(scan.skipped)")
            }
            if running { _ = try first.presence.isAlive(id: id) }
            let second = try container.presence.register(kind: "second")
            defer { second.release() }
            guard try container.presence.scan().records.contains(where: { $0.id == second.record.id }) else {
                return .loss("a registration made after the corruption is not listed")
            }
            return .recovered("")
        }
    }

    func ownerTokens(_ generator: inout SeededGenerator) async throws -> (FuzzMutation?, FuzzOutcome) {
        var first: SharedContainer? = try open()
        let token = try first!.owners.current()
        var observation: SignalObservation? = try first!.signals.observe("alpha")
        if !running {
            // As a process that died: its token is released, its file left behind.
            await first!.suspend()
            (first, observation) = (nil, nil)
            let hex = String(token, radix: 16)
            let file = baton + "/owners/" + String(repeating: "0", count: max(0, 16 - hex.count)) + hex
            if access(file, F_OK) != 0 { close(Foundation.open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)) }
        }
        let mutation = try mutate(&generator)
        return await judged(mutation) {
            let container = try open()
            let alive = container.owners.isAlive(token)
            if !running, alive, !mutation.replacesFile { return .loss("the token of a process that is gone reads as alive") }
            if let first, let observation {
                try first.signals.post("alpha", state: 1)
                _ = try await observation.next(deadline: try deadline())
            }
            let beta = try container.signals.observe("beta")
            try container.signals.post("beta", state: 2)
            _ = try await beta.next(deadline: try deadline())
            let queue = try TicketLock(container, name: "fuzz.queue")
            queue.release(try queue.acquire(deadline: try deadline(), interruption: { nil }))
            return .recovered(alive ? "" : "token reads as gone")
        }
    }
}

struct TestFailureText: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
