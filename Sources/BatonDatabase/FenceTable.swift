import Baton
import GRDB

/// The conflict behind a `fenced` error: the write's epoch and the current one.
public struct FenceConflict: Error, Sendable, Hashable, CustomStringConvertible {
    /// The fence's scope (a role's name).
    public var scope: String
    /// The epoch the write was made under.
    public var epoch: UInt64
    /// The current epoch, when known.
    public var currentEpoch: UInt64?

    public init(scope: String, epoch: UInt64, currentEpoch: UInt64?) {
        self.scope = scope
        self.epoch = epoch
        self.currentEpoch = currentEpoch
    }

    public var description: String {
        "epoch \(epoch) of \"\(scope)\" is stale" + (currentEpoch.map { "; current epoch \($0)" } ?? "")
    }
}

/// The highest fencing epoch each scope has written under, kept in the database itself
/// (`baton_fence`) so the check and the write are one transaction.
enum FenceTable {
    static let name = "baton_fence"

    /// Refuses a stale fence; otherwise records its epoch. Call inside the write transaction.
    static func check(_ fence: some Fence, in db: Database) throws {
        try db.execute(sql: "CREATE TABLE IF NOT EXISTS \(name) (scope TEXT PRIMARY KEY NOT NULL, epoch INTEGER NOT NULL) WITHOUT ROWID")
        let stored = try Int64.fetchOne(db, sql: "SELECT epoch FROM \(name) WHERE scope = ?", arguments: [fence.scope])
            .map { UInt64(bitPattern: $0) }
        if let stored, stored > fence.epoch {
            throw BatonError(
                .fenced,
                "write refused: it was made under epoch \(fence.epoch) of \"\(fence.scope)\", but this database has seen epoch \(stored): a newer holder exists. Take the role again and re-read the state",
                cause: FenceConflict(scope: fence.scope, epoch: fence.epoch, currentEpoch: stored)
            )
        }
        try fence.validate()
        if stored != fence.epoch {
            try db.execute(
                sql: "INSERT INTO \(name)(scope, epoch) VALUES (?, ?) ON CONFLICT(scope) DO UPDATE SET epoch = excluded.epoch WHERE excluded.epoch > epoch",
                arguments: [fence.scope, Int64(bitPattern: fence.epoch)]
            )
        }
    }
}
