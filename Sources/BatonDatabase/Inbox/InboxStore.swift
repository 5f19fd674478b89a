#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import Baton
import GRDB

/// The inbox table's queries. Every change is one transaction; expired messages are removed in
/// the same transaction as the next insert or claim.
struct InboxStore: Sendable {
    let database: SharedDatabase
    /// The longest lifetime stored (about 10,000 years); longer ones are cut to it.
    static let longestLifetime: TimeInterval = 3e11

    /// Stores `message` unless its id is already there. Returns whether it was inserted.
    func insert(_ message: IncomingMessage, defaultLifetime: TimeInterval) async throws -> Bool {
        try InboxMessage.validate(id: message.id)
        let lifetime = message.lifetime ?? defaultLifetime
        guard lifetime.isFinite, lifetime >= 0 else {
            throw BatonError(.invalidArgument, "the lifetime of message \(message.id) is NaN, infinite or negative; pass a number of seconds from 0 up (or nil for the default)")
        }
        let now = Date()
        let record = InboxMessage(
            id: message.id, payload: message.payload, receivedAt: now,
            // Past ten thousand years a date no longer round-trips; nothing lives that long.
            expiresAt: now.addingTimeInterval(min(lifetime, Self.longestLifetime)))
        return try await database.write { db in
            try Self.deleteExpired(db, now: now)
            try record.insert(db, onConflict: .ignore)
            return db.changesCount > 0
        }
    }

    /// The message `id` if it is stored and not expired.
    func message(id: String) async throws -> InboxMessage? {
        let now = Date()
        return try await database.read { db in
            try InboxMessage
                .filter(InboxMessage.Columns.id == id && InboxMessage.Columns.expiresAt > now.timeIntervalSince1970)
                .fetchOne(db)
        }
    }

    /// Whether every id in `ids` is stored (and not expired).
    func containsAll(_ ids: Set<String>) async throws -> Bool {
        guard !ids.isEmpty else { return true }
        let now = Date()
        let wanted = Array(ids)
        let count = try await database.read { db in
            try InboxMessage
                .filter(wanted.contains(InboxMessage.Columns.id) && InboxMessage.Columns.expiresAt > now.timeIntervalSince1970)
                .fetchCount(db)
        }
        return count == ids.count
    }

    /// Every message not expired, oldest first.
    func all() async throws -> [InboxMessage] {
        let now = Date()
        return try await database.read { db in
            try InboxMessage
                .filter(InboxMessage.Columns.expiresAt > now.timeIntervalSince1970)
                .order(InboxMessage.Columns.receivedAt, InboxMessage.Columns.id)
                .fetchAll(db)
        }
    }

    /// Marks `id` shown by `claimant` if nobody did yet and it has not expired: one UPDATE in a
    /// write transaction, so exactly one caller across all processes gets `true`.
    func claim(id: String, by claimant: String) async throws -> Bool {
        let now = Date()
        return try await database.write { db in
            try Self.deleteExpired(db, now: now)
            try db.execute(
                sql: """
                    UPDATE \(InboxMessage.databaseTableName)
                    SET shownAt = ?, shownBy = ?
                    WHERE id = ? AND shownAt IS NULL AND expiresAt > ?
                    """,
                arguments: [now.timeIntervalSince1970, claimant, id, now.timeIntervalSince1970])
            return db.changesCount == 1
        }
    }

    /// Removes expired messages; returns how many.
    func removeExpired() async throws -> Int {
        let now = Date()
        return try await database.write { db in
            try Self.deleteExpired(db, now: now)
            return db.changesCount
        }
    }

    private static func deleteExpired(_ db: Database, now: Date) throws {
        try InboxMessage.filter(InboxMessage.Columns.expiresAt <= now.timeIntervalSince1970).deleteAll(db)
    }
}
