#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The app's network core, as the inbox drives it: the app implements this over its own core
/// (a SIP stack, a Lightning node, a chat client).
///
/// ``run(delivering:)`` connects and runs until its task is cancelled. It hands every message it
/// receives to ``MessageSink/deliver(_:)`` and acknowledges it to its server only after that call
/// returns (the message is then durably stored), so a process killed in between loses nothing:
/// the server delivers it again to the next core. Whenever it has delivered everything its server
/// had pending, it calls ``MessageSink/nothingPending()``.
///
/// ```swift
/// struct CoreSource: MessageSource {
///     func run(delivering sink: MessageSink) async throws {
///         let core = try await Core.connect()
///         defer { core.disconnect() }
///         for try await event in core.events {
///             switch event {
///             case .message(let id, let body):
///                 try await sink.deliver(IncomingMessage(id: id, payload: body))
///                 core.acknowledge(id)
///             case .drained:
///                 sink.nothingPending()
///             }
///         }
///     }
/// }
/// ```
public protocol MessageSource: Sendable {
    /// Runs the core until the task is cancelled (return or throw `CancellationError` then).
    /// - Parameter sink: Where to hand received messages.
    /// - Throws: Whatever the core fails with; the inbox reports it to the caller.
    func run(delivering sink: MessageSink) async throws
}

/// A message as the core received it, before the inbox stores it.
public struct IncomingMessage: Sendable, Hashable, CustomStringConvertible {
    /// The unique id (a call id, a payment hash).
    public var id: String
    /// The content.
    public var payload: Data
    /// How long to keep it; `nil` for the inbox's default (300 seconds).
    public var lifetime: TimeInterval?

    /// Creates a message.
    public init(id: String, payload: Data, lifetime: TimeInterval? = nil) {
        self.id = id
        self.payload = payload
        self.lifetime = lifetime
    }

    public var description: String { "IncomingMessage(id: \(id), \(payload.count) bytes)" }
}

/// Where a ``MessageSource`` hands what it receives. Sendable: call it from any task or thread.
public struct MessageSink: Sendable {
    let deliverMessage: @Sendable (IncomingMessage) async throws -> Void
    let reportNothingPending: @Sendable () -> Void

    /// Creates a sink from two closures (the inbox makes its own; tests and adapters may too).
    public init(
        deliver: @escaping @Sendable (IncomingMessage) async throws -> Void,
        nothingPending: @escaping @Sendable () -> Void
    ) {
        deliverMessage = deliver
        reportNothingPending = nothingPending
    }

    /// Stores `message` durably (a duplicate id is ignored) and rings the inbox signal.
    /// Acknowledge the message to the server only after this returns.
    /// - Throws: A database error when the message could not be stored; do not acknowledge it then.
    public func deliver(_ message: IncomingMessage) async throws {
        try await deliverMessage(message)
    }

    /// Says that every message the server had pending has been delivered.
    public func nothingPending() {
        reportNothingPending()
    }
}
