/// Waiting for the first of several events.
enum ChannelWaits {
    /// Runs every wait concurrently; returns the index of the first that finishes and cancels
    /// the others. Throws the first failure (`timedOut`, `CancellationError`).
    static func first(_ waits: [@Sendable () async throws -> Void]) async throws -> Int {
        if waits.count == 1 {
            // One wait (a send or a receive on one channel): in this task, not in a child task,
            // which would cost its creation and a second thread hop on every wake-up.
            try await waits[0]()
            return 0
        }
        return try await withThrowingTaskGroup(of: Int.self) { group in
            for (index, wait) in waits.enumerated() {
                group.addTask {
                    try await wait()
                    return index
                }
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else {
                throw BatonError(.invalidArgument, "nothing to wait for")
            }
            return first
        }
    }
}
