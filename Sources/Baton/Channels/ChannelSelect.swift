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
    enum Attempted {
        case fired(() async throws -> Outcome)
        case notReady
        /// The select's waiter was claimed by a counterpart first.
        case ownClaimed
    }

    /// Tries the case without waiting. `own`: the select's waiter while it is registered (it
    /// is cancelled before the case fires).
    let attempt: (_ own: ChannelWaiterTable.Waiter?) throws -> Attempted
    /// What rings when the case may have become possible.
    let doorbell: ChannelDoorbell
    /// Whether the case's channel is closed (a closed channel's cases are always ready).
    let isClosed: () -> Bool
    /// Whether a wait also looks again now and then (for receivers or counterparts in other
    /// processes that died).
    let slowCheck: Bool
    /// For a rendezvous case: the waiter table, and how to arm the case while the select waits.
    /// Arming looks and arms in one critical section of the channel: a receive takes an element
    /// offered to it or registers as a waiting receiver; a send hands its element to a
    /// registered receiver or offers it. It returns what it armed (`nil` when nothing needs
    /// undoing) and whether the case fired while arming (the waiter was then cancelled first).
    let waiters: ChannelWaiterTable?
    let arm: ((_ waiter: ChannelWaiterTable.Waiter, _ index: Int) throws -> (armed: Armed?, attempted: Attempted))?

    struct Armed {
        /// Completes the case that a counterpart claimed: its handler, or `nil` when the claim
        /// came to nothing (the counterpart died before it finished).
        let complete: () throws -> (() async throws -> Outcome)?
        /// Undoes the arming (for a case that was not claimed).
        let disarm: () throws -> Void
    }

    /// Receives from `channel`; `handler` gets the element, or `nil` when the channel is closed
    /// and drained (a closed channel's receive case is always ready).
    public static func receive<Element>(
        from channel: SharedChannel<Element>,
        _ handler: @escaping (Element?) async throws -> Outcome
    ) -> Self {
        let rendezvous = channel.capacity == .rendezvous
        /// One look (`registering`: and, finding nothing, registers `own` under the same lock).
        func look(own: ChannelWaiterTable.Waiter?, registering: Int?) throws -> Attempted {
            while true {
                switch try channel.attemptReceive(own: own, registering: registering) {
                case .element(let element): return .fired { try await handler(element) }
                case .end:
                    if let own, !channel.log.waiters.cancelForOwnMove(own) { return .ownClaimed }
                    return .fired { try await handler(nil) }
                case .retry: continue
                case .ownClaimed: return .ownClaimed
                case .empty(let othersTaking):
                    if othersTaking, try channel.log.recoverDeadTakers() { continue }
                    return .notReady
                }
            }
        }
        return Self(
            attempt: { own in try look(own: own, registering: nil) },
            doorbell: channel.log.readable,
            isClosed: { channel.log.isClosed },
            slowCheck: channel.log.storage.isFile,
            waiters: rendezvous ? channel.log.waiters : nil,
            arm: rendezvous ? { waiter, index in
                // Take what is offered, or register, under one lock.
                let attempted = try look(own: waiter, registering: index)
                // A case that fired took nothing it must give back.
                if case .fired = attempted { return (nil, attempted) }
                return (Armed(
                    complete: {
                        while true {
                            switch try channel.attemptReceive(addressedTo: waiter) {
                            case .element(let element): return { try await handler(element) }
                            case .retry: continue
                            default: return nil
                            }
                        }
                    },
                    disarm: { try channel.log.unregister(waiter) }), attempted)
            } : nil
        )
    }

    /// Sends `element` to `channel`, then runs `handler`.
    ///
    /// A send to a rendezvous channel fires when a receiver takes the element while the select
    /// waits (the element is offered on every such case at once, but a receiver takes an offer
    /// only by claiming the whole select, so only one fires). A send to a closed channel makes
    /// the select throw `closed`.
    public static func send<Element>(
        _ element: Element,
        to channel: SharedChannel<Element>,
        _ handler: @escaping () async throws -> Outcome
    ) -> Self {
        let rendezvous = channel.capacity == .rendezvous
        return Self(
            attempt: { own in
                switch try channel.trySend(element, own: own) {
                case .appended: return .fired { try await handler() }
                case .refused, .offered: return .notReady
                case .ownClaimed: return .ownClaimed
                }
            },
            doorbell: channel.log.writable,
            isClosed: { channel.log.isClosed },
            slowCheck: rendezvous && channel.log.storage.isFile,
            waiters: rendezvous ? channel.log.waiters : nil,
            arm: rendezvous ? { waiter, index in
                // Hand the element to a registered receiver, or offer it, under one lock.
                let (sendID, result) = try channel.append(element, mode: .handoffOrOffer(waiter, case: index), own: nil)
                switch result {
                case .appended: return (nil, .fired { try await handler() })
                case .offered:
                    return (Armed(
                        complete: { try channel.log.withdraw(sendID: sendID) ? nil : { try await handler() } },
                        disarm: { _ = try channel.log.withdraw(sendID: sendID) }), .notReady)
                case .ownClaimed, .refused: return (nil, .ownClaimed)
                }
            } : nil
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
///   `invalidArgument` when the rendezvous cases are channels of different ``SharedContainer``
///   objects; whatever the handler throws.
public func select<Outcome>(
    _ cases: ChannelSelectCase<Outcome>...,
    deadline: Deadline = .never
) async throws -> Outcome {
    try await select(cases, deadline: deadline)
}

/// The error of a select (or a rendezvous send or receive) that reached its deadline.
func selectTimedOut() -> BatonError {
    BatonError(.timedOut, "no case of the select became possible before the deadline")
}

/// Starts a pass of a select (or of a rendezvous send or receive): from the second pass on, or
/// from the first unless `armingLooks`, stops at cancellation or at the deadline (a select that
/// arms to look arms once even past the deadline, so a counterpart already there is met).
/// Returns how long the pass may sleep: with `slow` (a file channel's receive, or rendezvous
/// case), it also looks again every 250 ms, for counterparts and takers that died.
func startPass(_ first: inout Bool, armingLooks: Bool, slow: Bool, deadline: Deadline) throws -> Deadline {
    try beginPass(&first, armingLooks: armingLooks, deadline: deadline)
    return passSlice(slow: slow, deadline: deadline)
}

/// ``startPass(_:armingLooks:slow:deadline:)`` without the slice, for a caller that asks for it
/// (``passSlice(slow:deadline:)``) only when it is about to sleep: most passes complete without
/// a wait, and the slice costs a read of the clock.
func beginPass(_ first: inout Bool, armingLooks: Bool, deadline: Deadline) throws {
    if !armingLooks || !first {
        try Task.checkCancellation()
        if deadline.hasPassed { throw selectTimedOut() }
    }
    first = false
}

/// How long a pass may sleep (see ``startPass(_:armingLooks:slow:deadline:)``).
func passSlice(slow: Bool, deadline: Deadline) -> Deadline {
    slow ? deadline.earliest(.after(.milliseconds(250))) : deadline
}

/// After a pass of a select (or of a rendezvous send or receive) that completed no case:
/// returns to go round again (nothing failed, or only the pass's time slice ended); throws
/// `failure`, or `timedOut` once the deadline has passed.
func goRoundAgain(after failure: (any Error)?, deadline: Deadline) throws {
    guard let failure else { return }
    if let error = failure as? BatonError, error.code == .timedOut {
        if deadline.hasPassed { throw selectTimedOut() }
        return
    }
    throw failure
}

/// ``select(_:deadline:)`` over an array of cases.
///
/// Like Go's `select`: the cases are tried in a random order; when none can proceed and some
/// are on rendezvous channels, the select takes a waiter record (``ChannelWaiterTable``),
/// registers it as a receiver on its rendezvous receive cases and offers its element on its
/// rendezvous send cases, then tries every case once more (a counterpart that arrived meanwhile
/// saw the registration or the offer, or this look sees it) and sleeps on the cases' doorbells.
/// A counterpart completes it only by claiming the record for one case; the select cancels the
/// record before it completes a case itself, gives up, or is cancelled, and then withdraws every
/// other registration and offer.
public func select<Outcome>(
    _ cases: [ChannelSelectCase<Outcome>],
    deadline: Deadline = .never
) async throws -> Outcome {
    guard !cases.isEmpty else {
        throw BatonError(.invalidArgument, "select needs at least one case")
    }
    let rendezvous = cases.indices.filter { cases[$0].arm != nil }
    let table = rendezvous.first.flatMap { cases[$0].waiters }
    if let table, rendezvous.contains(where: { cases[$0].waiters !== table }) {
        throw BatonError(.invalidArgument, "a select's rendezvous cases must be channels opened through one SharedContainer object (or all in-process channels): each container object waits under its own owner token")
    }
    let doorbells = cases.map(\.doorbell)
    // Receives fall back to a slow check for dead takers and dead counterparts; every other
    // wake-up is a doorbell.
    let slow = cases.contains { $0.slowCheck }
    // Every case rendezvous: arming looks at each case anyway, so there is no first look
    // without a waiter (one critical section per case instead of two).
    let armingLooks = table != nil && rendezvous.count == cases.count
    var first = true
    while true {
        var seen = doorbells.map { $0.snapshot() }
        let start = FastRandom.int(in: 0..<cases.count)
        if !armingLooks {
            for step in 0..<cases.count {
                if case .fired(let fire) = try cases[(start + step) % cases.count].attempt(nil) { return try await fire() }
            }
        }
        let slice = try startPass(&first, armingLooks: armingLooks, slow: slow, deadline: deadline)
        func waits() -> [@Sendable () async throws -> Void] {
            zip(doorbells, seen).map { doorbell, seen in
                { try await doorbell.wait(after: seen, deadline: slice, spinning: false) }
            }
        }
        guard let table else {
            // Watch every doorbell for a moment before waking a task per case.
            if ChannelDoorbell.spin(Array(zip(doorbells, seen))) { continue }
            do {
                _ = try await ChannelWaits.first(waits())
            } catch let error as BatonError where error.code == .timedOut {
                if deadline.hasPassed { throw selectTimedOut() }
            }
            continue
        }
        // Arm the rendezvous cases under one waiter, look once more, then sleep.
        let waiter = try table.begin()
        var armed: [Int: ChannelSelectCase<Outcome>.Armed] = [:]
        var fired: (() async throws -> Outcome)?
        var failure: (any Error)?
        do {
            var settled = false // a case fired, or the waiter was claimed
            arming: for step in 0..<cases.count {
                let index = (start + step) % cases.count
                guard let arm = cases[index].arm else { continue }
                let (armedCase, attempted) = try arm(waiter, index)
                if let armedCase { armed[index] = armedCase }
                switch attempted {
                case .fired(let fire): fired = fire; settled = true; break arming
                case .ownClaimed: settled = true; break arming
                case .notReady: continue
                }
            }
            // The other cases (not rendezvous) once more: a counterpart that arrived meanwhile
            // rang after this look, or this look sees it.
            if !settled {
                look: for step in 0..<cases.count where cases[(start + step) % cases.count].arm == nil {
                    switch try cases[(start + step) % cases.count].attempt(waiter) {
                    case .fired(let fire): fired = fire; break look
                    case .ownClaimed: break look
                    case .notReady: if !table.isWaiting(waiter) { break look }
                    }
                }
            }
            if fired == nil, armingLooks, table.isWaiting(waiter) {
                // Every way a rendezvous case completes now claims the waiter first and rings
                // after: read the doorbells again (not to wake for this select's own offers,
                // whose deferred rings go first), then look at the claim word and at closing.
                ChannelExecutor.makeDeferredRings()
                seen = doorbells.map { $0.snapshot() }
                if cases.contains(where: { $0.isClosed() }) { settled = true }
            }
            if fired == nil && !settled && table.isWaiting(waiter) {
                if !ChannelDoorbell.spin(Array(zip(doorbells, seen))) { _ = try await ChannelWaits.first(waits()) }
            }
        } catch {
            failure = error
        }
        // Close the wait: nothing can claim the waiter after this.
        let claimed = table.finish(waiter)
        do {
            if fired == nil, let claimed, let case_ = armed[claimed] {
                fired = try case_.complete()
                armed[claimed] = nil
            }
            for (_, case_) in armed { try case_.disarm() }
        } catch {
            table.end(waiter)
            throw error
        }
        table.end(waiter)
        if let fired { return try await fired() }
        try goRoundAgain(after: failure, deadline: deadline)
    }
}
