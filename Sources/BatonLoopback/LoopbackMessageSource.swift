import Baton
import BatonDatabase
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// A `MessageSource` over the ``LoopbackServer``: the "network core" of the inbox's tests,
/// benchmark and sample, and of the simulator's app and extension. Connects with a ``LoopbackClient``,
/// says `HELLO`, stores each `MSG` through the sink before acknowledging it, and reports `IDLE`
/// as nothing pending. Cancellation shuts the connection down.
///
/// The server it connects to is a ``LoopbackServer`` created in some process (the simulator,
/// the lifecycle tests and the benchmarks' workers create one), or a process of its own:
/// `baton-harness inbox loopback serve` prints `listening PORT`, and `baton-harness inbox
/// loopback push --port PORT ID=PAYLOAD` queues messages on it. `baton-harness` is the test
/// harness executable, built beside `baton`; it is not a user command.
package struct LoopbackMessageSource: MessageSource {
    package let port: UInt16
    /// The name the connection gives the server.
    package var name: String
    /// Simulated core start-up time, before connecting (a real core takes a while to start).
    package var startupDelay: Duration = .zero
    /// Called when the core is connected (`source-connected`), after each stored message
    /// (`stored ID`) and when the connection ends (`source-disconnected`).
    package var onEvent: @Sendable (String) -> Void = { _ in }

    /// A source for the server on `port`.
    package init(port: UInt16, name: String = "core", startupDelay: Duration = .zero, onEvent: @escaping @Sendable (String) -> Void = { _ in }) {
        self.port = port
        self.name = name
        self.startupDelay = startupDelay
        self.onEvent = onEvent
    }

    package func run(delivering sink: MessageSink) async throws {
        try await run(epoch: 0, receive: { message in
            try await sink.deliver(IncomingMessage(id: message.id, payload: Data(message.payload)))
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
    /// - Throws: `lost` when the server closes the connection, `CancellationError`,
    ///   `systemCallFailed` when it cannot connect.
    package func run(
        epoch: UInt64,
        receive: @Sendable (LoopbackMessage) async throws -> Void,
        isDone: @Sendable () -> Bool
    ) async throws {
        if startupDelay > .zero { try await Task.sleep(for: startupDelay) }
        let client = try LoopbackClient(port: port, hello: .init(name: name, epoch: epoch))
        onEvent("source-connected")
        defer {
            client.disconnect()
            onEvent("source-disconnected")
        }
        try await withTaskCancellationHandler {
            for await line in client.incoming {
                try Task.checkCancellation()
                switch line {
                case .message(let message):
                    try await receive(message)
                    onEvent("stored \(message.id)")
                    client.send(.ack(id: message.id))
                case .idle:
                    if isDone() { return }
                default:
                    continue
                }
            }
            try Task.checkCancellation()
            throw BatonError(.lost, "the loopback server on port \(port) closed the connection")
        } onCancel: {
            // Not `disconnect()`, which may wait for the poll loop's thread: see `shutDown()`.
            // The loop's thread then finishes `incoming`, and the `defer` above disconnects.
            client.shutDown()
        }
    }
}
