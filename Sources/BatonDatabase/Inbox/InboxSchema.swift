import GRDB

/// The inbox's schema, as migrations an app adds to its own migrator (when the inbox shares the
/// app's database) or that ``Inbox/open(container:path:configuration:)`` runs on its own file.
public enum InboxSchema {
    /// The migration identifiers this module registers, in order.
    public static let migrationIdentifiers = ["baton.inbox.v1"]

    /// Registers the inbox table's migrations in `migrator`.
    ///
    /// ```swift
    /// var migrator = DatabaseMigrator()
    /// InboxSchema.registerMigrations(in: &migrator)
    /// migrator.registerMigration("app.v1") { db in ... }
    /// ```
    public static func registerMigrations(in migrator: inout DatabaseMigrator) {
        migrator.registerMigration("baton.inbox.v1") { db in
            try db.create(table: InboxMessage.databaseTableName) { table in
                table.primaryKey("id", .text)
                table.column("payload", .blob).notNull()
                // Times: seconds since 1970 (see InboxMessage).
                table.column("receivedAt", .double).notNull()
                table.column("expiresAt", .double).notNull().indexed()
                table.column("shownBy", .text)
                table.column("shownAt", .double)
            }
        }
    }

    /// A migrator holding only the inbox's migrations (for an inbox in a database of its own).
    public static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        registerMigrations(in: &migrator)
        return migrator
    }
}
