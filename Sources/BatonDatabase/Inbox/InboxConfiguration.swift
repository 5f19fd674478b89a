#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// How an ``Inbox`` behaves. The defaults suit an iOS app and its notification service extension.
public struct InboxConfiguration: Sendable, Hashable {
    /// How long a message is kept when its ``IncomingMessage/lifetime`` is `nil`: 300 seconds.
    public var messageLifetime: TimeInterval
    /// ``Inbox/message(id:deadline:source:)`` gives up this long before its deadline, so the
    /// extension still has time to show a generic notification before the system's limit
    /// (default: 2 seconds).
    public var timeoutMargin: Duration
    /// The role the app and the extensions share for the network core (default `core`).
    public var roleName: String
    /// The signal rung after each stored message (default `baton.inbox`). Give each inbox of a
    /// container its own.
    public var signalName: String
    /// The kind this process announces when it becomes the executor (default `extension`).
    public var executorKind: String

    /// Creates a configuration.
    public init(
        messageLifetime: TimeInterval = InboxMessage.defaultLifetime,
        timeoutMargin: Duration = .seconds(2),
        roleName: String = "core",
        signalName: String = "baton.inbox",
        executorKind: String = "extension"
    ) {
        self.messageLifetime = messageLifetime
        self.timeoutMargin = timeoutMargin
        self.roleName = roleName
        self.signalName = signalName
        self.executorKind = executorKind
    }
}
