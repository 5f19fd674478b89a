/// What ``Inbox/message(id:deadline:source:)`` returns.
public enum InboxDelivery: Sendable, Hashable {
    /// The message, and how it reached this process.
    case message(InboxMessage, InboxRoute)
    /// The deadline (minus the configured margin) came first: show a generic notification.
    case timedOut

    /// The message, or `nil` after a timeout.
    public var message: InboxMessage? {
        if case .message(let message, _) = self { return message }
        return nil
    }
}

/// How a message reached the process that asked for it.
public enum InboxRoute: String, Sendable, Hashable, CustomStringConvertible {
    /// It was already stored when asked for.
    case alreadyStored
    /// Another process (the app, or an extension acting as the executor) stored it meanwhile.
    case storedByAnotherProcess
    /// This process ran the source as the executor and received it.
    case receivedByThisProcess

    public var description: String { rawValue }
}
