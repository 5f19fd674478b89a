import Baton
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import GRDB

/// Hands messages from the network core to whichever process shows them, each shown exactly once.
///
/// A push arrives for message X. If the app runs, its core receives X and stores it; the
/// notification service extension finds it there. If the app does not run, one extension becomes
/// the executor, runs the core until everything pending is received, and stores it all; the
/// others find theirs in the store. Messages live in a table of the shared database (durable,
/// atomic, a duplicate id is ignored), and each stored message rings the inbox signal, so waiting
/// processes re-read at once instead of polling.
///
/// In the app (holding the `main` role):
/// ```swift
/// let inbox = try await Inbox.open(container: container)
/// let lease = try await Role(container, name: "core").acquire(priority: .main, kind: "app", deadline: .never)
/// try await inbox.run(CoreSource())          // until cancelled; every message is stored
/// ```
/// In a notification service extension:
/// ```swift
/// let inbox = try await Inbox.open(container: container)
/// switch try await inbox.message(id: callID, deadline: .after(.seconds(30)), source: CoreSource()) {
/// case .message(let message, _):
///     if try await inbox.claimForDisplay(id: callID) { show(message.payload) }
/// case .timedOut:
///     showGenericNotification()
/// }
/// ```
public final class Inbox: Sendable {
    /// The default file name of an inbox that has a database of its own, inside the container.
    public static let defaultFileName = "baton-inbox.sqlite"

    /// The shared container.
    public let container: SharedContainer
    /// How this inbox behaves.
    public let configuration: InboxConfiguration
    let store: InboxStore
    let role: Role
    /// Identifies this inbox among the executor runs of the process.
    let runKey: String
    /// The shared database that holds the inbox table.
    public let database: SharedDatabase

    /// An inbox whose table lives in `database`, a shared database the app opened with the
    /// inbox's migrations (``InboxSchema/registerMigrations(in:)``) in its migrator.
    /// - Throws: `invalidName` for a bad role or signal name.
    public init(database: SharedDatabase, configuration: InboxConfiguration = InboxConfiguration()) throws {
        try Signals.validate(configuration.signalName)
        self.container = database.container
        self.configuration = configuration
        self.database = database
        self.store = InboxStore(database: database)
        self.role = try Role(database.container, name: configuration.roleName)
        self.runKey = "\(database.container.path)\u{0}\(configuration.roleName)\u{0}\(configuration.signalName)\u{0}\(database.path)"
    }

    // MARK: Storing (the app, or the executor)

    /// Stores a message the core received, unless its id is already stored, then rings the inbox
    /// signal. Expired messages are removed in the same transaction.
    /// - Returns: Whether the message was new.
    /// - Throws: `invalidArgument` for a bad id or a NaN, infinite or negative lifetime; a
    ///   database error when it could not be stored.
    @discardableResult
    public func store(_ message: IncomingMessage) async throws -> Bool {
        let inserted = try await store.insert(message, defaultLifetime: configuration.messageLifetime)
        if inserted { try container.signals.post(configuration.signalName) }
        return inserted
    }

    /// Runs `source` until the task is cancelled, storing every message it receives. The app
    /// calls this while it holds the `main` role.
    /// - Throws: What the source throws; `CancellationError` when cancelled.
    public func run(_ source: some MessageSource) async throws {
        let sink = MessageSink(
            deliver: { [self] message in _ = try await self.store(message) },
            nothingPending: {})
        try await source.run(delivering: sink)
    }

    // MARK: Reading and showing

    /// The stored message `id`, if it is there and has not expired.
    /// - Throws: A database error.
    public func storedMessage(id: String) async throws -> InboxMessage? {
        try await store.message(id: id)
    }

    /// Every stored message that has not expired, oldest first.
    /// - Throws: A database error.
    public func messages() async throws -> [InboxMessage] {
        try await store.all()
    }

    /// Claims message `id` for display: `true` for exactly one caller across all processes, and
    /// only while the message is stored and not expired. Expired messages are removed on the way.
    /// - Parameters:
    ///   - id: The message.
    ///   - claimant: Who shows it, recorded in ``InboxMessage/shownBy`` (default: the process kind
    ///     and pid).
    /// - Returns: Whether this caller should show the message.
    /// - Throws: A database error.
    public func claimForDisplay(id: String, by claimant: String? = nil) async throws -> Bool {
        try await store.claim(id: id, by: claimant ?? "\(configuration.executorKind) pid \(getpid())")
    }

    /// Removes expired messages.
    /// - Returns: How many were removed.
    /// - Throws: A database error.
    @discardableResult
    public func removeExpired() async throws -> Int {
        try await store.removeExpired()
    }
}
