import ArgumentParser
import Baton
import BatonCommandSupport
import BatonDatabase
import BatonSimulator
import CBatonShims
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

/// `baton inspect`: a container's whole state, read without changing anything.
struct InspectCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "inspect",
        abstract: "Show a container's whole state: roles, processes, defaults, channels, databases, signals, locks.",
        discussion: """
            Read-only: creates, repairs and removes nothing (safe on a container copied off a \
            device), and reports damaged files instead of failing on them. Exits 0, or 6 when a \
            file is damaged (the report is printed either way).
            """)

    @Option(name: .long, help: "The shared container directory (default: $BATON_CONTAINER).")
    var container: String?
    @Flag(help: "Print one JSON object.") var json = false

    func run() async throws {
        guard var path = container ?? environment("BATON_CONTAINER") else {
            throw ValidationError("no container: pass --container DIR or set BATON_CONTAINER")
        }
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw CommandOutcome(.notFound, "not found: the container directory \(path) does not exist")
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw CommandOutcome(.notFound, "not found: \(path) is not a directory")
        }
        guard lstat(path + "/.baton", &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            throw CommandOutcome(.notFound, "not found: \(path) holds no Baton state (no .baton directory)")
        }
        let report = ContainerInspector(path: path).inspect()
        if json {
            emit(try jsonLine(report.json))
        } else {
            for line in report.lines { emit(line) }
        }
        if !report.damage.isEmpty {
            throw CommandOutcome(.damaged, "damaged: \(report.damage.count) problem\(report.damage.count == 1 ? "" : "s") found (\(report.damage.map(\.file).joined(separator: ", ")))")
        }
    }
}

/// Reads a container's files without writing: every file is opened read-only, without
/// following links and without blocking (a FIFO planted in `.baton` is reported, not waited on).
struct ContainerInspector {
    let path: String
    var baton: String { path + "/.baton" }

    struct Damage { var file: String; var problem: String }

    struct Report {
        var container: String
        var processes: [JSONValue] = []
        var ownerTokens = (alive: 0, dead: 0)
        var roles: [JSONValue] = []
        var defaults: [JSONValue] = []
        var channels: [JSONValue] = []
        var databases: [JSONValue] = []
        var signals: JSONValue = .null
        var locks: [JSONValue] = []
        var damage: [Damage] = []
        var lines: [String] = []

        var json: JSONValue {
            .object([
                "container": .string(container),
                "processes": .array(processes),
                "owner_tokens": .object(["alive": .int(ownerTokens.alive), "dead": .int(ownerTokens.dead)]),
                "roles": .array(roles),
                "defaults": .array(defaults),
                "channels": .array(channels),
                "databases": .array(databases),
                "signals": signals,
                "locks": .array(locks),
                "damage": .array(damage.map { .object(["file": .string($0.file), "problem": .string($0.problem)]) }),
            ])
        }
    }

    enum FileRead {
        case bytes([UInt8])
        case missing
        case problem(String)
    }

    /// Up to `limit` bytes of `relative` (under `.baton`), read-only.
    func read(_ relative: String, limit: Int = 64 << 20) -> FileRead {
        let fd = open(baton + "/" + relative, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return .missing }
            if errno == ELOOP { return .problem("a symbolic link where Baton keeps a file") }
            return .problem("cannot be opened: \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { return .problem("cannot be checked: \(String(cString: strerror(errno)))") }
        guard info.st_mode & S_IFMT == S_IFREG else { return .problem("not a regular file") }
        let size = min(Int(info.st_size), limit)
        var bytes = [UInt8](repeating: 0, count: size)
        var done = 0
        while done < size {
            let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, size - done, off_t(done)) }
            if count < 0, errno == EINTR { continue }
            if count < 0 { return .problem("cannot be read: \(String(cString: strerror(errno)))") }
            if count == 0 { break }
            done += count
        }
        return .bytes(Array(bytes[0..<done]))
    }

    /// Whether another process holds a `flock` on `relative` (probed with a shared, non-blocking
    /// lock that is dropped at once; nothing is written). `nil` when the file cannot be opened.
    func isLocked(_ relative: String) -> Bool? {
        let fd = open(baton + "/" + relative, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return errno == ENOENT ? false : nil }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { return nil }
        if flock(fd, LOCK_SH | LOCK_NB) == 0 {
            flock(fd, LOCK_UN)
            return false
        }
        return errno == EWOULDBLOCK
    }

    func tokenAlive(_ token: UInt64) -> Bool { isLocked(Inspection.ownerTokenFile(token)) == true }

    /// The names in a directory under `.baton` (sorted; empty when it does not exist).
    func list(_ relative: String) -> [String] {
        guard let stream = opendir(relative.isEmpty ? baton : baton + "/" + relative) else { return [] }
        defer { closedir(stream) }
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != ".", name != ".." { names.append(name) }
        }
        return names.sorted()
    }

    func isDirectory(_ relative: String) -> Bool {
        var info = stat()
        return lstat(baton + "/" + relative, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
    }

    func inspect() -> Report {
        var report = Report(container: path)
        var lines: [String] = ["container \(path)"]
        func damaged(_ file: String, _ problem: String) {
            report.damage.append(Damage(file: file, problem: problem))
        }

        // Processes.
        var kinds: [Int32: String] = [:]
        lines.append("processes:")
        for name in list("presence") where name.hasSuffix(".lock") {
            let file = "presence/" + name
            let alive = isLocked(file)
            guard case .bytes(let bytes) = read(file, limit: 4096) else {
                damaged(file, "not a readable presence file")
                continue
            }
            guard alive == true else { continue }
            guard let record = try? JSONDecoder().decode(PresenceRecord.self, from: Data(bytes)) else {
                damaged(file, "a live process's presence file is not valid JSON")
                continue
            }
            kinds[record.pid] = record.kind
            report.processes.append(.object(["id": .string(record.id), "kind": .string(record.kind), "pid": .int(Int(record.pid)), "since": .string(iso8601(record.since))]))
            lines.append("  \(record.pid) \(record.kind) since \(iso8601(record.since))")
        }
        if report.processes.isEmpty { lines.append("  none live") }
        for name in list("owners") {
            guard let token = UInt64(name, radix: 16) else { continue }
            if tokenAlive(token) { report.ownerTokens.alive += 1 } else { report.ownerTokens.dead += 1 }
        }
        lines.append("  owner tokens: \(report.ownerTokens.alive) alive, \(report.ownerTokens.dead) left by dead or suspended processes")

        // Roles.
        lines.append("roles:")
        for name in list("roles") where isDirectory("roles/" + name) {
            let file = "roles/\(name)/record"
            var fields: [String: JSONValue] = ["name": .string(name)]
            switch read(file) {
            case .missing:
                fields["holder"] = .null
                lines.append("  \(name): no record")
            case .problem(let problem):
                damaged(file, problem)
                fields["damage"] = .string(problem)
                lines.append("  \(name): DAMAGED: \(problem)")
            case .bytes(let bytes):
                let role = Inspection.role(record: bytes)
                if let damage = role.damage {
                    damaged(file, damage)
                    fields["damage"] = .string(damage)
                }
                fields["last_epoch"] = .int(Int(role.lastEpoch))
                fields["heartbeat"] = role.heartbeat.map { .string(iso8601($0)) } ?? .null
                if let holder = role.holder {
                    let alive = isLocked("roles/\(name)/\(holder.lockFile)") == true
                    var object: [String: JSONValue] = [
                        "pid": .int(Int(holder.pid)), "kind": .string(holder.kind), "priority": .int(holder.priority),
                        "epoch": .int(Int(holder.epoch)), "state": .string(holder.state), "since": .string(iso8601(holder.since)),
                        "alive": .bool(alive),
                    ]
                    if let stop = holder.stopRequest {
                        object["stop_request"] = .object(["priority": .int(stop.priority), "pid": .int(Int(stop.pid)), "deadline": .string(iso8601(stop.deadline))])
                    }
                    fields["holder"] = .object(object)
                    lines.append("  \(name): held by \(holder.kind) (pid \(holder.pid), priority \(holder.priority)) epoch \(holder.epoch), \(holder.state)\(alive ? "" : " -- holder gone (freed on next use)")")
                } else {
                    fields["holder"] = .null
                    lines.append("  \(name): free (last epoch \(role.lastEpoch))\(role.damage.map { " DAMAGED: \($0)" } ?? "")")
                }
                fields["waiters"] = .array(role.waiters.map { waiter in
                    let alive = isLocked("roles/\(name)/\(waiter.lockFile)") == true
                    if alive { lines.append("    waiting: pid \(waiter.pid), priority \(waiter.priority), since \(iso8601(waiter.since))") }
                    return .object(["pid": .int(Int(waiter.pid)), "priority": .int(waiter.priority), "since": .string(iso8601(waiter.since)), "alive": .bool(alive)])
                })
            }
            report.roles.append(.object(fields))
        }
        if report.roles.isEmpty { lines.append("  none") }

        // Defaults.
        lines.append("defaults:")
        let suites = Set(list("defaults").compactMap { name -> String? in
            for suffix in [".meta", ".log"] where name.hasSuffix(suffix) { return String(name.dropLast(suffix.count)) }
            return nil
        }).sorted()
        for suite in suites {
            let logFile = "defaults/\(suite).log", metaFile = "defaults/\(suite).meta"
            var meta: [UInt8]?
            switch read(metaFile, limit: 4096) {
            case .bytes(let bytes): meta = bytes
            case .missing: meta = nil
            case .problem(let problem): damaged(metaFile, problem)
            }
            let log: [UInt8]
            switch read(logFile, limit: Int.max) {
            case .bytes(let bytes): log = bytes
            case .missing:
                damaged(logFile, "missing (the suite's values are lost)")
                log = []
            case .problem(let problem):
                damaged(logFile, problem)
                log = []
            }
            let result = Inspection.defaults(meta: meta, log: log)
            for problem in result.damage { damaged(logFile, problem) }
            report.defaults.append(.object([
                "suite": .string(suite), "keys": .array(result.keys.map(JSONValue.string)),
                "log_bytes": .int(result.logBytes), "committed_bytes": .int(result.committedBytes),
                "corrupt_bytes": .int(result.corruptBytes), "corrupt_regions": .int(result.corruptRegions),
                "torn_tail_bytes": .int(result.tornTailBytes), "watchers": .int(result.watchers),
                "damage": .array(result.damage.map(JSONValue.string)),
            ]))
            lines.append("  \(suite): \(result.keys.count) keys (\(result.keys.prefix(8).joined(separator: ", "))\(result.keys.count > 8 ? ", ..." : "")), log \(result.logBytes) bytes, \(result.committedBytes) committed, \(result.watchers) watching")
            if result.tornTailBytes > 0 { lines.append("    a write torn by a crash: \(result.tornTailBytes) bytes past the committed end (dropped on next open)") }
            for problem in result.damage { lines.append("    DAMAGED: \(problem)") }
        }
        if suites.isEmpty { lines.append("  none") }

        // Channels.
        lines.append("channels:")
        for name in list("channels") {
            let file = "channels/" + name
            var fields: [String: JSONValue] = ["name": .string(name)]
            switch read(file, limit: 4096) {
            case .missing: continue
            case .problem(let problem):
                damaged(file, problem)
                fields["damage"] = .string(problem)
                lines.append("  \(name): DAMAGED: \(problem)")
            case .bytes(let bytes):
                let channel = Inspection.channel(header: bytes)
                if let damage = channel.damage {
                    damaged(file, damage)
                    fields["damage"] = .string(damage)
                    lines.append("  \(name): DAMAGED: \(damage)")
                    if channel.capacity == "?" { break }
                }
                let receivers = channel.receiverTokens.filter(tokenAlive).count
                fields.merge([
                    "capacity": .string(channel.capacity), "depth": .int(channel.depth), "taken": .int(channel.taken),
                    "closed": .bool(channel.closed), "waiting_receivers": .int(channel.waitingReceivers),
                    "sleeping_receivers": .int(channel.sleepingReceivers), "sleeping_senders": .int(channel.sleepingSenders),
                    "receivers_alive": .int(receivers),
                ]) { _, new in new }
                lines.append("  \(name): \(channel.capacity), \(channel.depth) ready, \(channel.taken) taken\(channel.closed ? ", closed" : ""); \(channel.waitingReceivers) receivers waiting, \(channel.sleepingSenders) senders asleep; \(receivers) live receiver processes")
            }
            report.channels.append(.object(fields))
        }
        if report.channels.isEmpty { lines.append("  none") }

        // Databases: the writer queues, matched with the SQLite files of the container.
        lines.append("databases:")
        var files: [String: String] = [:]
        for name in listContainer() {
            let full = path + "/" + name
            guard isSQLite(full) else { continue }
            var resolved = full
            if let real = realpath(full, nil) {
                resolved = String(cString: real)
                free(real)
            }
            files[SharedDatabase.identifier(ofPath: resolved)] = full
        }
        var seen = Set<String>()
        for name in list("database") where name.hasSuffix(".queue") {
            let identifier = String(name.dropLast(".queue".count))
            seen.insert(identifier)
            let file = "database/" + name
            var fields: [String: JSONValue] = ["identifier": .string(identifier), "path": files[identifier].map(JSONValue.string) ?? .null]
            fields["wal_bytes"] = files[identifier].map { .int(fileSize($0 + "-wal")) } ?? .null
            switch read(file) {
            case .missing: continue
            case .problem(let problem):
                damaged(file, problem)
                fields["damage"] = .string(problem)
            case .bytes(let bytes):
                let queue = WriterQueueInspection.inspect(bytes)
                if let damage = queue.damage {
                    damaged(file, damage)
                    fields["damage"] = .string(damage)
                }
                func ticket(_ ticket: WriterQueueInspection.Ticket) -> JSONValue {
                    .object(["pid": .int(Int(ticket.pid)), "alive": .bool(ticket.token != 0 && tokenAlive(ticket.token)), "kind": kinds[ticket.pid].map(JSONValue.string) ?? .null])
                }
                fields["writer"] = queue.holder.map(ticket) ?? .null
                fields["writer_keeps_turn"] = .bool(queue.kept)
                fields["waiters"] = .array(queue.waiters.map(ticket))
                fields["commits"] = .int(Int(queue.commits))
                fields["last_commit_pid"] = .int(Int(queue.lastCommitPID))
                let holder = queue.holder.map { "writer pid \($0.pid)\(tokenAlive($0.token) ? "" : " (gone)")" } ?? "no writer"
                lines.append("  \(files[identifier] ?? "database \(identifier) (file not in the container)"): WAL \(files[identifier].map { "\(fileSize($0 + "-wal")) bytes" } ?? "?"), \(holder), \(queue.waiters.count) waiting, \(queue.commits) commits\(queue.damage.map { " DAMAGED: \($0)" } ?? "")")
            }
            report.databases.append(.object(fields))
        }
        for (identifier, file) in files.sorted(by: { $0.value < $1.value }) where !seen.contains(identifier) {
            report.databases.append(.object(["identifier": .string(identifier), "path": .string(file), "wal_bytes": .int(fileSize(file + "-wal")), "writer": .null, "waiters": .array([])]))
            lines.append("  \(file): WAL \(fileSize(file + "-wal")) bytes, never written through Baton")
        }
        if report.databases.isEmpty { lines.append("  none") }

        // Signals.
        switch read("signals") {
        case .missing:
            lines.append("signals: no table")
        case .problem(let problem):
            damaged("signals", problem)
            report.signals = .object(["damage": .string(problem)])
            lines.append("signals: DAMAGED: \(problem)")
        case .bytes(let bytes):
            let table = Inspection.signals(table: bytes)
            if let damage = table.damage { damaged("signals", damage) }
            let observing = table.processes.filter { tokenAlive($0.token) }
            report.signals = .object([
                "names_used": .int(table.names.count), "slot_count": .int(table.slotCount),
                "observing_processes": .int(observing.count), "retired": .bool(table.retired),
                "names": .array(table.names.map { .object(["name": .string($0.name), "posts": .int(Int(truncatingIfNeeded: $0.counter)), "state": .string(String($0.state)), "observers": .int($0.observers)]) }),
                "damage": table.damage.map(JSONValue.string) ?? .null,
            ])
            lines.append("signals: \(table.names.count) of \(table.slotCount) names used, \(observing.count) processes observing\(table.damage.map { "; DAMAGED: \($0)" } ?? "")")
            for name in table.names.prefix(20) {
                lines.append("  \(name.name): \(name.counter) posts, state \(name.state), \(name.observers) observers")
            }
        }

        // Locks held now, and by whom (the kernel's list; Linux).
        let inodes = inodeNames()
        for lock in ProcFS.locks() where !lock.waiting {
            guard let file = inodes[lock.inode] else { continue }
            report.locks.append(.object([
                "file": .string(file), "pid": .int(Int(lock.pid)), "kind": kinds[lock.pid].map(JSONValue.string) ?? .null,
                "mode": .string(lock.exclusive ? "exclusive" : "shared"), "type": .string(lock.kind.lowercased()),
            ]))
        }
        lines.append("locks held:")
        if report.locks.isEmpty { lines.append("  none") }
        for case .object(let lock) in report.locks {
            if case .string(let file) = lock["file"], case .int(let pid) = lock["pid"], case .string(let mode) = lock["mode"] {
                lines.append("  \(file): \(mode), pid \(pid)\(kinds[Int32(pid)].map { " (\($0))" } ?? "")")
            }
        }

        if !report.damage.isEmpty {
            lines.append("damage:")
            for item in report.damage { lines.append("  \(item.file): \(item.problem)") }
        }
        report.lines = lines
        return report
    }

    /// The container's own entries (not `.baton`), where applications keep their databases.
    func listContainer() -> [String] {
        guard let stream = opendir(path) else { return [] }
        defer { closedir(stream) }
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if !name.hasPrefix(".") { names.append(name) }
        }
        return names.sorted()
    }

    /// Whether the regular file at `path` starts with SQLite's header.
    func isSQLite(_ path: String) -> Bool {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { return false }
        var header = [UInt8](repeating: 0, count: 16)
        guard header.withUnsafeMutableBytes({ pread(fd, $0.baseAddress, 16, 0) }) == 16 else { return false }
        return header == Array("SQLite format 3\0".utf8)
    }

    func fileSize(_ path: String) -> Int {
        var info = stat()
        return stat(path, &info) == 0 ? Int(info.st_size) : 0
    }

    /// Every file under `.baton` and the container's databases, by inode.
    func inodeNames() -> [UInt64: String] {
        var result: [UInt64: String] = [:]
        func walk(_ relative: String, depth: Int) {
            for name in list(relative) {
                let child = relative.isEmpty ? name : relative + "/" + name
                var info = stat()
                guard lstat(baton + "/" + child, &info) == 0 else { continue }
                if info.st_mode & S_IFMT == S_IFDIR {
                    if depth < 4 { walk(child, depth: depth + 1) }
                } else {
                    result[UInt64(info.st_ino)] = ".baton/" + child
                }
            }
        }
        walk("", depth: 0)
        for name in listContainer() {
            var info = stat()
            if lstat(path + "/" + name, &info) == 0, info.st_mode & S_IFMT == S_IFREG { result[UInt64(info.st_ino)] = name }
        }
        return result
    }
}
