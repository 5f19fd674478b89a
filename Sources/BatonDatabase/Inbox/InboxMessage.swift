#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Baton
import GRDB

/// A message handed from the network core to whichever process shows it: a chat message, an
/// incoming call, a payment.
///
/// Stored in the inbox table of the shared database. The ``id`` is unique (a call id, a payment
/// hash): storing the same id twice keeps the first. ``shownBy`` and ``shownAt`` say which
/// process claimed it for display (``Inbox/claimForDisplay(id:by:)``), once across all
/// processes.
///
/// Descriptions never print the payload.
public struct InboxMessage: Sendable, Hashable, Identifiable, CustomStringConvertible {
    /// The unique id (a call id, a payment hash).
    public var id: String
    /// The content, opaque to Baton.
    public var payload: Data
    /// When the message was stored.
    public var receivedAt: Date
    /// After this instant the message is removed and may no longer be claimed.
    public var expiresAt: Date
    /// Who claimed it for display (a process kind and pid, or what the caller said), if anyone.
    public var shownBy: String?
    /// When it was claimed for display, if it was.
    public var shownAt: Date?

    /// Creates a message.
    /// - Parameters:
    ///   - id: The unique id; 1 to 1,024 bytes of UTF-8.
    ///   - payload: The content.
    ///   - receivedAt: When it was received (default: now).
    ///   - expiresAt: When it expires (default: 300 seconds after `receivedAt`).
    public init(id: String, payload: Data, receivedAt: Date = Date(), expiresAt: Date? = nil, shownBy: String? = nil, shownAt: Date? = nil) {
        self.id = id
        self.payload = payload
        self.receivedAt = receivedAt
        self.expiresAt = expiresAt ?? receivedAt.addingTimeInterval(InboxMessage.defaultLifetime)
        self.shownBy = shownBy
        self.shownAt = shownAt
    }

    /// How long a message is kept when nobody says otherwise: 300 seconds.
    public static let defaultLifetime: TimeInterval = 300

    /// The longest id, in bytes of UTF-8.
    public static let maxIDBytes = 1_024

    /// Whether the message was claimed for display.
    public var isShown: Bool { shownAt != nil }

    public var description: String {
        "InboxMessage(id: \(id), \(payload.count) bytes, shown: \(isShown))"
    }

    /// Checks an id: 1...1,024 bytes of UTF-8.
    /// - Throws: `invalidArgument`.
    package static func validate(id: String) throws {
        let count = id.utf8.count
        guard count >= 1, count <= maxIDBytes else {
            throw BatonError(.invalidArgument, "a message id must be 1 to \(maxIDBytes) bytes of UTF-8; this one is \(count) bytes")
        }
    }
}

extension InboxMessage: FetchableRecord, PersistableRecord {
    /// The inbox table.
    public static let databaseTableName = "batonInboxMessage"

    /// The columns of the inbox table.
    public enum Columns {
        public static let id = Column("id")
        public static let payload = Column("payload")
        public static let receivedAt = Column("receivedAt")
        public static let expiresAt = Column("expiresAt")
        public static let shownBy = Column("shownBy")
        public static let shownAt = Column("shownAt")
    }

    // Times are stored as seconds since 1970 (REAL), not as GRDB's date strings: formatting and
    // parsing those goes through Foundation's DateFormatter and Calendar, which load ICU and cost
    // an extension several MiB of its 24 MB.

    public init(row: Row) throws {
        id = row[Columns.id]
        payload = row[Columns.payload]
        receivedAt = Date(timeIntervalSince1970: row[Columns.receivedAt])
        expiresAt = Date(timeIntervalSince1970: row[Columns.expiresAt])
        shownBy = row[Columns.shownBy]
        shownAt = (row[Columns.shownAt] as Double?).map { Date(timeIntervalSince1970: $0) }
    }

    public func encode(to container: inout PersistenceContainer) throws {
        container[Columns.id] = id
        container[Columns.payload] = payload
        container[Columns.receivedAt] = receivedAt.timeIntervalSince1970
        container[Columns.expiresAt] = expiresAt.timeIntervalSince1970
        container[Columns.shownBy] = shownBy
        container[Columns.shownAt] = shownAt?.timeIntervalSince1970
    }
}
