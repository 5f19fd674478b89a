/// A connection that a ``ConnectionSupervisor`` keeps up: a socket to your server, a WebSocket,
/// a peer session. Your `connect()` closure creates one; the supervisor watches it.
///
/// Implementations must be safe to call from several tasks at once.
public protocol SupervisedConnection: Sendable {
    /// Returns once the connection is closed, whoever closed it (the peer, the network, or
    /// ``close()``). Returns at once if it is already closed.
    ///
    /// The supervisor awaits it on the same executor as ``close()`` on a stop request (the
    /// grant's ``ConnectionGrant/stopRequestExecutor``), so that the close resumes it without
    /// waking another thread: suspend until the end, never block.
    func closed() async

    /// Closes the connection and returns once it is closed. Calling it more than once is safe.
    ///
    /// On a stop request the supervisor calls it on the grant's
    /// ``ConnectionGrant/stopRequestExecutor`` (with a ``RolePermit``, the process's signal
    /// thread), so that the hand-over goes on without waking another thread: return promptly
    /// and never block that thread (closing a socket is fine; hop to your own actor or queue
    /// for slow work, such as flushing to the server).
    func close() async

    /// Sends a keep-alive probe.
    /// - Throws: Any error when the connection is no longer usable; the supervisor then closes
    ///   it and reconnects.
    func ping() async throws
}
