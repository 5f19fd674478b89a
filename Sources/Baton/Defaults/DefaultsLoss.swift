#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// One thing found wrong with a suite's files, and what it cost: part of
/// ``DefaultsRecoveryReport/losses``.
///
/// A loss found by a process that only reads is reported by that process (it reads around the
/// damage and rewrites nothing). The next write repairs it under the writer lock, keeps the bytes
/// it drops in a quarantine file (`.baton/defaults/<suite>.quarantine-<n>`: a copy of the log as
/// it was, so offsets in the report are offsets in that file) and records the loss in
/// `.baton/defaults/<suite>.losses`, where every process and every later
/// ``SharedDefaults/verify()`` sees it until ``SharedDefaults/acknowledgeRecovery()``.
///
/// Descriptions name keys by count, never print values.
public struct DefaultsLoss: Sendable, Hashable, Codable, CustomStringConvertible {
    /// What happened (extensible).
    public struct Kind: RawRepresentable, Sendable, Hashable, Codable, CustomStringConvertible {
        public var rawValue: String
        /// Creates a kind from its name.
        public init(rawValue: String) { self.rawValue = rawValue }
        /// A committed record failed its checksum, with valid records after it.
        public static let corruptRecord = Self(rawValue: "corruptRecord")
        /// Committed bytes at the end of the log are not valid records.
        public static let corruptTail = Self(rawValue: "corruptTail")
        /// The meta's `committed` word disagreed with the log's checksummed records; the
        /// records were trusted. Nothing is lost by this alone.
        public static let committedWordDisagreed = Self(rawValue: "committedWordDisagreed")
        /// The log file was cut short by another program.
        public static let truncated = Self(rawValue: "truncated")
        public var description: String { rawValue }
    }

    /// What happened.
    public var kind: Kind
    /// Where in the log (as it was, and as the quarantine copy holds it) the damage starts.
    public var offset: Int
    /// How many bytes are damaged or cut off.
    public var byteCount: Int
    /// Keys whose newest value was in the damaged bytes and that now hold an older value.
    public var rolledBackKeys: [String] = []
    /// Keys whose only or newest value was in the damaged bytes and that are now absent.
    public var lostKeys: [String] = []
    /// Keys removed in the damaged bytes that hold their old value again.
    public var resurrectedKeys: [String] = []
    /// Whether the damaged bytes were too damaged to tell which keys they held.
    public var keysUnknown = false
    /// The quarantine copy of the bytes, relative to the container's `.baton` directory; `nil`
    /// while not yet repaired, or when there was nothing left to copy.
    public var quarantineFile: String?
    /// What was done, in words.
    public var detail: String

    /// Whether values were lost (a rollback counts as a loss).
    public var lostData: Bool { kind != .committedWordDisagreed }

    public var description: String {
        var text: String
        switch kind {
        case .corruptRecord: text = "corrupt record at offset \(offset) (\(byteCount) bytes)"
        case .corruptTail: text = "corrupt committed bytes at offset \(offset) (\(byteCount) bytes, end of the log)"
        case .truncated: text = "log truncated by another program to \(offset) bytes (\(byteCount) bytes of records cut off)"
        case .committedWordDisagreed: text = "the meta's committed word disagreed with the log"
        default: text = "\(kind) at offset \(offset) (\(byteCount) bytes)"
        }
        var effects: [String] = []
        if !rolledBackKeys.isEmpty { effects.append("\(rolledBackKeys.count) key(s) rolled back to an older value") }
        if !resurrectedKeys.isEmpty { effects.append("\(resurrectedKeys.count) removed key(s) came back") }
        if !lostKeys.isEmpty { effects.append("\(lostKeys.count) key(s) lost") }
        if keysUnknown { effects.append("the keys it held cannot be told") }
        if !effects.isEmpty { text += ": " + effects.joined(separator: ", ") }
        text += "; " + detail
        if let quarantineFile { text += "; bytes kept in \(quarantineFile)" }
        return text
    }

    init(kind: Kind, offset: Int, byteCount: Int, detail: String) {
        self.kind = kind
        self.offset = offset
        self.byteCount = byteCount
        self.detail = detail
    }
}

/// The persisted list of unacknowledged losses of a suite, `.baton/defaults/<suite>.losses`
/// (JSON). Written only under the writer lock.
enum DefaultsLossFile {
    static func path(suite: String) -> String { "defaults/\(suite).losses" }

    /// The recorded losses (empty when none, or when the file cannot be read: a damaged list is
    /// reported as one loss rather than thrown at every getter).
    static func read(_ container: SharedContainer, suite: String) -> [DefaultsLoss] {
        let bytes: [UInt8]?
        do { bytes = try container.readFile(path(suite: suite)) } catch {
            return [DefaultsLoss(kind: .init(rawValue: "unreadableLossList"), offset: 0, byteCount: 0, detail: "\(container.absolutePath(path(suite: suite))) cannot be read: \(error)")]
        }
        guard let bytes, !bytes.isEmpty else { return [] }
        if let losses = try? JSONDecoder().decode([DefaultsLoss].self, from: Data(bytes)) { return losses }
        return [DefaultsLoss(kind: .init(rawValue: "unreadableLossList"), offset: 0, byteCount: bytes.count, detail: "\(container.absolutePath(path(suite: suite))) is damaged; read it, then acknowledge")]
    }

    /// Appends `losses` (caller holds the writer lock).
    static func append(_ losses: [DefaultsLoss], _ container: SharedContainer, suite: String) throws {
        guard !losses.isEmpty else { return }
        let all = read(container, suite: suite).filter { $0.kind.rawValue != "unreadableLossList" } + losses
        let encoded = try JSONEncoder().encode(all)
        try container.replaceFile(path(suite: suite), with: Array(encoded))
    }

    /// Forgets every recorded loss (caller holds the writer lock).
    static func clear(_ container: SharedContainer, suite: String) throws {
        switch Sys.unlinkat(container.directory, path(suite: suite)) {
        case .success: return
        case .failure(let error) where error.errno == ENOENT: return
        case .failure(let error): throw BatonError.system(error, "removing \(container.absolutePath(path(suite: suite)))")
        }
    }

    /// Copies `count` bytes at `base` (the log as it is, before a repair drops some of it) to a
    /// new `defaults/<suite>.quarantine-<n>`, synced; returns its path relative to `.baton`.
    /// Caller holds the writer lock (or the meta's initialisation lock).
    static func quarantine(_ base: UnsafeRawPointer, count: Int, _ container: SharedContainer, suite: String) throws -> String {
        let prefix = "\(suite).quarantine-"
        let highest = Sys.directoryEntries(container.directory, "defaults")
            .compactMap { $0.hasPrefix(prefix) ? Int($0.dropFirst(prefix.utf8.count)) : nil }
            .max() ?? 0
        let relative = "defaults/\(prefix)\(highest + 1)"
        let file = try container.openDescriptor(relative, flags: O_WRONLY | O_CREAT | O_EXCL)
        let fd = file.rawValue
        do {
            // `base` is a shared mapping: copied through a private buffer, never handed to the
            // kernel. If another program cut the file short under it, a copy by the CPU faults
            // and the mapping guard extends the file (the copy holds zeros there), where the
            // kernel reading the mapping for pwrite(2) would fail with EFAULT instead.
            let chunk = 64 * 1024
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: min(max(count, 1), chunk), alignment: 16)
            defer { buffer.deallocate() }
            var offset = 0
            while offset < count {
                let length = min(chunk, count - offset)
                buffer.baseAddress!.copyMemory(from: base + offset, byteCount: length)
                try Sys.pwriteAll(fd, UnsafeRawBufferPointer(rebasing: buffer[0..<length]), at: offset).get("writing \(relative)")
                offset += length
            }
            try DurableSync.sync(fd).get("syncing \(relative)")
        } catch {
            _ = Sys.unlinkat(container.directory, relative)
            throw error
        }
        return relative
    }
}
