/// One case of ``select(_:deadline:)``: a receive from a channel or a send to a channel, with the
/// code to run when it is the case taken.
///
/// ```swift
/// let outcome = try await select(
///     .receive(from: requests) { request in Outcome.request(request) },
///     .send(status, to: updates) { Outcome.sent },
///     deadline: .after(.seconds(1)))
/// ```
public struct ChannelSelectCase<Outcome> {
    /// Tries the case without waiting; returns its handler when the case fired.
    let attempt: () throws -> (() async throws -> Outcome)?
    /// What rings when the case may have become possible.
    let doorbell: ChannelDoorbell
    /// For a send to a rendezvous channel: puts the element in the channel for a receiver to
    /// take while the select waits.
    let offer: (() throws -> Offer)?
    /// For a receive from a rendezvous channel: the channel's log, to count a waiting receiver.
    let rendezvousReceiveLog: ChannelLog?
    /// For a receive: the channel's log, to return elements of dead takers.
    let receiveLog: ChannelLog?

    struct Offer {
        /// Removes the element unless it was taken. `true` when removed (the case did not fire).
        let withdraw: () throws -> Bool
        let handler: () async throws -> Outcome
    }

    /// Receives from `channel`; `handler` gets the element, or `nil` when the channel is closed
    /// and drained (a closed channel's receive case is always ready).
    public static func receive<Element>(
        from channel: SharedChannel<Element>,
        _ handler: @escaping (Element?) async throws -> Outcome
    ) -> Self {
        Self(
            attempt: {
                while true {
                    switch try channel.attemptReceive() {
                    case .element(let element): return { try await handler(element) }
                    case .end: return { try await handler(nil) }
                    case .retry: continue
                    case .empty(let othersTaking):
                        if othersTaking, try channel.log.recoverDeadTakers() { continue }
                        return nil
                    }
                }
            },
            doorbell: channel.log.readable,
            offer: nil,
            rendezvousReceiveLog: channel.capacity == .rendezvous ? channel.log : nil,
            receiveLog: channel.log
        )
    }

    /// Sends `element` to `channel`, then runs `handler`.
    ///
    /// A send to a rendezvous channel fires when a receiver takes the element while the select
    /// waits (at most one such send is offered at a time; the others fire only if a receiver is
    /// already waiting). A send to a closed channel makes the select throw `closed`.
    public static func send<Element>(
        _ element: Element,
        to channel: SharedChannel<Element>,
        _ handler: @escaping () async throws -> Outcome
    ) -> Self {
        let rendezvous = channel.capacity == .rendezvous
        return Self(
            attempt: {
                try channel.trySend(element) ? { try await handler() } : nil
            },
            doorbell: channel.log.writable,
            offer: rendezvous ? {
                let sendID = try channel.append(element, mode: .always)!
                return Offer(withdraw: { try channel.log.withdraw(sendID: sendID) }, handler: handler)
            } : nil,
            rendezvousReceiveLog: nil,
            receiveLog: nil
        )
    }
}

/// Waits until one of `cases` can proceed, takes exactly that one, and returns what its handler
/// returns. When several are ready, one is picked at random.
///
/// - Parameters:
///   - cases: Receives and sends on one or more channels (of any element types).
///   - deadline: When to give up.
/// - Returns: The outcome of the case taken.
/// - Throws: `timedOut` at the deadline and `CancellationError` on cancellation (no case was
///   taken); `closed` for a send case on a closed channel; `malformedFrame` from a receive case;
///   whatever the handler throws.
public func select<Outcome>(
    _ cases: ChannelSelectCase<Outcome>...,
    deadline: Deadline = .never
) async throws -> Outcome {
    try await select(cases, deadline: deadline)
}

private func timedOut() -> BatonError {
    BatonError(.timedOut, "no case of the select became possible before the deadline")
}

/// ``select(_:deadline:)`` over an array of cases.
public func select<Outcome>(
    _ cases: [ChannelSelectCase<Outcome>],
    deadline: Deadline = .never
) async throws -> Outcome {
    guard !cases.isEmpty else {
        throw BatonError(.invalidArgument, "select needs at least one case")
    }
    var counted: [ChannelLog] = []
    defer { for log in counted { log.adjustWaitingReceivers(-1) } }
    let offering = cases.indices.filter { cases[$0].offer != nil }
    var round = 0
    while true {
        let doorbells = cases.map(\.doorbell)
        let seen = doorbells.map { $0.snapshot() }
        let start = Int.random(in: 0..<cases.count)
        for step in 0..<cases.count {
            if let fire = try cases[(start + step) % cases.count].attempt() { return try await fire() }
        }
        try Task.checkCancellation()
        if deadline.hasPassed { throw timedOut() }
        if counted.isEmpty {
            counted = cases.compactMap(\.rendezvousReceiveLog)
            for log in counted { log.adjustWaitingReceivers(1) }
            if !counted.isEmpty { continue }
        }
        // Receives fall back to a slow check for dead takers; every other wake-up is a doorbell.
        let slice = cases.contains { $0.receiveLog?.storage.isFile == true } ? deadline.earliest(.after(.milliseconds(250))) : deadline
        let waits: [@Sendable () async throws -> Void] = zip(doorbells, seen).map { doorbell, seen in
            { try await doorbell.wait(after: seen, deadline: slice, spinning: false) }
        }
        if offering.isEmpty {
            // Watch every doorbell for a moment before waking a task per case.
            if ChannelDoorbell.spin(Array(zip(doorbells, seen))) { continue }
            do {
                _ = try await ChannelWaits.first(waits)
            } catch let error as BatonError where error.code == .timedOut {
                if deadline.hasPassed { throw timedOut() }
            }
            continue
        }
        // One rendezvous send offered at a time, so at most one case can fire.
        let offer = try cases[offering[round % offering.count]].offer!()
        round += 1
        do {
            if !ChannelDoorbell.spin(Array(zip(doorbells, seen))) {
                _ = try await ChannelWaits.first(waits)
            }
        } catch {
            if try offer.withdraw() {
                if let error = error as? BatonError, error.code == .timedOut {
                    if deadline.hasPassed { throw timedOut() }
                    continue
                }
                throw error
            }
            return try await offer.handler()
        }
        if try !offer.withdraw() { return try await offer.handler() }
    }
}
