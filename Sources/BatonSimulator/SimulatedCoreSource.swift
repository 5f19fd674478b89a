import Baton
import BatonDatabase
import BatonLoopback
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// The app's network core in the simulation: one connection to the loopback server, as a
/// Baton `MessageSource` (a ``LoopbackMessageSource`` that reports to the simulator).
///
/// ``run(delivering:)`` connects, hands each message to the inbox's sink (which stores it
/// durably), acknowledges it to the server only after that, says `nothingPending()` whenever the
/// server is idle, and runs until its task is cancelled or the server closes the connection. The
/// connection is closed when it returns, so it never outlives the role that allowed it.
package struct SimulatedCoreSource: MessageSource {
    /// The server's port on 127.0.0.1.
    package let port: UInt16
    /// The role the core runs under: its current epoch goes into the server's connection record.
    let role: Role?
    /// Report `role-acquired`/`role-released` around each run (an extension's source runs only
    /// while its process holds the `executor` role, which the inbox takes and releases).
    let reportsRole: Bool
    /// Called after each message is stored (the app shows it).
    let afterStore: (@Sendable (String) async -> Void)?

    package init(port: UInt16, role: Role? = nil, reportsRole: Bool = false, afterStore: (@Sendable (String) async -> Void)? = nil) {
        self.port = port
        self.role = role
        self.reportsRole = reportsRole
        self.afterStore = afterStore
    }

    package func run(delivering sink: MessageSink) async throws {
        let epoch = (try? role?.status().epoch) ?? 0
        if reportsRole { ChildChannel.emit(.roleAcquired, epoch: epoch, detail: "executor") }
        defer { if reportsRole { ChildChannel.emit(.roleReleased, epoch: epoch, detail: "executor") } }
        try await run(epoch: epoch, receive: { message in
            try await sink.deliver(IncomingMessage(id: message.id, payload: Data(message.payload)))
            ChildChannel.emit(.stored, message: message.id, detail: reportsRole ? "executor" : "app")
            await afterStore?(message.id)
        }, isDone: {
            sink.nothingPending()
            return false
        })
    }

    /// Runs one connection (``run(delivering:)`` without an inbox).
    /// - Parameters:
    ///   - epoch: The role epoch this connection runs under (the server records it).
    ///   - receive: Stores a message; it is acknowledged after this returns.
    ///   - isDone: Asked each time the server is idle; `true` ends the run.
    /// - Throws: `lost` when the server closes the connection, `CancellationError`, socket errors.
    func run(
        epoch: UInt64,
        receive: @Sendable (LoopbackMessage) async throws -> Void,
        isDone: @Sendable () -> Bool
    ) async throws {
        let source = LoopbackMessageSource(port: port, name: reportsRole ? "extension" : "app") { event in
            switch event {
            case "source-connected": ChildChannel.emit(.connected, epoch: epoch)
            case "source-disconnected": ChildChannel.emit(.disconnected, epoch: epoch)
            default: break
            }
        }
        try await source.run(epoch: epoch, receive: receive, isDone: isDone)
    }
}
