import Baton
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import GRDB

extension Inbox {
    /// Opens (creating it if needed) an inbox with a database of its own, by default
    /// `<container>/baton-inbox.sqlite`. Safe when several processes open it at the same instant:
    /// the schema is created once.
    /// - Parameters:
    ///   - container: The shared container.
    ///   - path: The database file (default: ``defaultFileName`` in the container).
    ///   - configuration: How the inbox behaves.
    /// - Throws: File-system and database errors; `invalidName` for a bad role or signal name.
    public static func open(container: SharedContainer, path: String? = nil, configuration: InboxConfiguration = InboxConfiguration()) async throws -> Inbox {
        let path = path ?? container.path + "/" + defaultFileName
        let pool = try await InboxDatabaseOpener.open(path: path, container: container)
        return try Inbox(storage: WriterStorage(writer: pool), database: pool, container: container, identity: path, configuration: configuration)
    }
}

/// Opens an inbox database file: a WAL `DatabasePool` whose migrations run under an exclusive
/// cross-process lock, so that processes opening a new file at once create the schema once.
enum InboxDatabaseOpener {
    static func open(path: String, container: SharedContainer) async throws -> DatabasePool {
        var configuration = Configuration()
        configuration.busyMode = .timeout(5)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        let lock = try FileLock(container, name: "inbox-migrate.lock")
        let held = try await lock.lock(.exclusive, deadline: .after(.seconds(10)))
        defer { held.release() }
        let pool = try DatabasePool(path: path, configuration: configuration)
        try InboxSchema.migrator.migrate(pool)
        return pool
    }
}
