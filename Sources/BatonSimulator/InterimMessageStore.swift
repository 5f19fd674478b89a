import Baton
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

/// The simulation's message store, built on the foundation alone (atomic files and signals)
/// while Baton's `Inbox` is not available on this branch.
///
/// A message is a file `sim-inbox/<id>.msg` written atomically (write, fsync, rename); showing
/// it creates `sim-inbox/<id>.shown` with `O_EXCL`, which exactly one caller wins across all
/// processes. Each store rings `sim.inbox`.
final class InterimMessageStore: Sendable {
    static let signal = "sim.inbox"
    static let directory = "sim-inbox"
    let container: SharedContainer

    init(container: SharedContainer) throws {
        self.container = container
        try container.makeDirectory(Self.directory)
    }

    /// Stores a message; a duplicate id is ignored. Returns whether it was new.
    @discardableResult
    func store(_ message: ReceivedMessage) throws -> Bool {
        let path = Self.directory + "/" + message.id + ".msg"
        try SharedContainer.validateName(message.id, what: "a message id")
        if try container.readFile(path) != nil { return false }
        try container.replaceFile(path, with: Array("\(message.sent) \(message.payload)".utf8))
        try container.signals.post(Self.signal)
        return true
    }

    /// Whether the message is stored.
    func contains(_ id: String) throws -> Bool {
        try container.readFile(Self.directory + "/" + id + ".msg") != nil
    }

    /// True for exactly one caller across all processes.
    func claimForDisplay(_ id: String) throws -> Bool {
        let path = container.absolutePath(Self.directory + "/" + id + ".shown")
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        if fd >= 0 {
            fsync(fd)
            close(fd)
            return true
        }
        if errno == EEXIST { return false }
        throw SimulatorError.system("creating \(path)", errno)
    }

    /// Every stored message's id.
    func storedIDs() throws -> Set<String> {
        try names().messages
    }

    /// Stored messages nobody has shown yet.
    func unshown() throws -> [String] {
        let names = try names()
        return names.messages.subtracting(names.shown).sorted()
    }

    private func names() throws -> (messages: Set<String>, shown: Set<String>) {
        guard let stream = opendir(container.absolutePath(Self.directory)) else { return ([], []) }
        defer { closedir(stream) }
        var messages = Set<String>()
        var shown = Set<String>()
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name.hasSuffix(".msg") { messages.insert(String(name.dropLast(4))) }
            if name.hasSuffix(".shown") { shown.insert(String(name.dropLast(6))) }
        }
        return (messages, shown)
    }
}
