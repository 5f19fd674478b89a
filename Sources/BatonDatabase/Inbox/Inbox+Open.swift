import Baton

extension Inbox {
    /// Opens (creating it if needed) an inbox with a database of its own, by default
    /// `<container>/baton-inbox.sqlite`, as a ``SharedDatabase``: processes opening a new file at
    /// the same instant create the schema once.
    /// - Parameters:
    ///   - container: The shared container.
    ///   - path: The database file (default: ``defaultFileName`` in the container).
    ///   - configuration: How the inbox behaves.
    ///   - databaseConfiguration: The shared database's settings.
    /// - Throws: What ``SharedDatabase/open(at:container:migrator:configuration:)`` throws;
    ///   `invalidName` for a bad role or signal name.
    public static func open(
        container: SharedContainer,
        path: String? = nil,
        configuration: InboxConfiguration = InboxConfiguration(),
        databaseConfiguration: SharedDatabase.Configuration = SharedDatabase.Configuration()
    ) async throws -> Inbox {
        let path = path ?? container.path + "/" + defaultFileName
        let database = try await SharedDatabase.open(at: path, container: container, migrator: InboxSchema.migrator, configuration: databaseConfiguration)
        return try Inbox(database: database, configuration: configuration)
    }
}
