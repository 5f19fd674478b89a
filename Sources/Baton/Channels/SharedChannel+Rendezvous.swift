// A rendezvous send or receive on one channel: `select`'s protocol for a single case, without
// its general machinery.
//
// `select` handles any number of cases of any element types: an array of cases, closures for
// each way a case is tried, armed and completed, arrays of doorbells and snapshots, a table of
// armed cases. A plain `send` or `receive` is a select of one case, and on a loaded machine,
// where both sides of a conversation share one core, the time of a round trip is the length of
// that code (a measured ~10 µs a side). These two functions take exactly the steps `select`
// takes for one rendezvous case, in the same order and under the same locks (the claim word,
// the registration, the offer), with none of the allocations. Go does the same: `chansend` and
// `chanrecv` beside `selectgo`.

extension SharedChannel {
    /// What one look at a rendezvous receive case found (``ChannelSelectCase/receive(from:_:)``'s
    /// `look`).
    private enum ReceiveLook {
        /// An element, or `nil`: closed and drained.
        case fired(Element?)
        case notReady
        case ownClaimed
    }

    /// One look at the channel for a receive (and, with `registering`, registration under the
    /// same lock when nothing is there): as ``ChannelSelectCase/receive(from:_:)`` looks.
    private func lookForReceive(own: ChannelWaiterTable.Waiter, registering: Int?) throws -> ReceiveLook {
        while true {
            switch try attemptReceive(own: own, registering: registering) {
            case .element(let element): return .fired(element)
            case .end:
                if !log.waiters.cancelForOwnMove(own) { return .ownClaimed }
                return .fired(nil)
            case .retry: continue
            case .ownClaimed: return .ownClaimed
            case .empty(let othersTaking):
                if othersTaking, try log.recoverDeadTakers() { continue }
                return .notReady
            }
        }
    }

    /// After arming, unless the case `settled` (it fired, or its waiter was claimed): looks at
    /// the claim word and at closing once more, then spins or sleeps on `doorbell` while the
    /// waiter still waits. Every way the case completes now claims the waiter first and rings
    /// after, so the doorbell is read before that look.
    ///
    /// The rings this pass deferred (``ChannelExecutor/deferRings(of:bits:token:)``: its offer
    /// or registration, and the withdrawal of the last pass's) are made before that read. Made
    /// after it (by the spin, as they were), they moved the word past it, and the wait ended
    /// at once on the task's own ring: a send then withdrew its offer and offered again, a wake
    /// system call a turn, until the scheduler's tick gave the receiver the processor they
    /// shared (up to 10 ms).
    @inline(__always)
    nonisolated(nonsending) private func waitForCounterpart(_ waiter: ChannelWaiterTable.Waiter, ringing doorbell: ChannelDoorbell, settled: Bool, until deadline: Deadline) async throws {
        guard !settled, log.waiters.isWaiting(waiter) else { return }
        ChannelExecutor.makeDeferredRings()
        let seen = doorbell.snapshot()
        guard !log.isClosed, log.waiters.isWaiting(waiter), !doorbell.spin(after: seen) else { return }
        try await doorbell.wait(after: seen, deadline: passSlice(slow: log.storage.isFile, deadline: deadline), spinning: false)
    }

    /// ``receive(deadline:)`` on a rendezvous channel: ``select(_:deadline:)`` of the one case
    /// `.receive(from: self) { $0 }`, step for step.
    @inline(__always)
    nonisolated(nonsending) func receiveRendezvous(deadline: Deadline) async throws -> Element? {
        let table = log.waiters
        var first = true
        while true {
            try beginPass(&first, armingLooks: true, deadline: deadline)
            let waiter = try table.begin()
            var fired: Element??
            var armed = false
            var failure: (any Error)?
            do {
                var settled = false
                switch try lookForReceive(own: waiter, registering: 0) {
                case .fired(let element): fired = .some(element); settled = true
                case .ownClaimed: armed = true; settled = true
                case .notReady: armed = true
                }
                try await waitForCounterpart(waiter, ringing: log.readable, settled: settled, until: deadline)
            } catch {
                failure = error
            }
            // Close the wait: nothing can claim the waiter after this.
            let claimed = table.finish(waiter)
            do {
                if fired == nil, claimed != nil, armed {
                    armed = false
                    completing: while true {
                        switch try attemptReceive(addressedTo: waiter) {
                        case .element(let element): fired = .some(element); break completing
                        case .retry: continue
                        default: break completing // the claim came to nothing: the sender died
                        }
                    }
                }
                if armed { try log.unregister(waiter) }
            } catch {
                table.end(waiter)
                throw error
            }
            table.end(waiter)
            if let fired { return fired }
            try goRoundAgain(after: failure, deadline: deadline)
        }
    }

    /// ``send(_:deadline:)`` on a rendezvous channel: ``select(_:deadline:)`` of the one case
    /// `.send(element, to: self) {}`, step for step.
    @inline(__always)
    nonisolated(nonsending) func sendRendezvous(_ element: Element, deadline: Deadline) async throws {
        let table = log.waiters
        var first = true
        while true {
            try beginPass(&first, armingLooks: true, deadline: deadline)
            let waiter = try table.begin()
            var fired = false
            var offer: UInt64? // the send id of the element offered under `waiter`
            var failure: (any Error)?
            do {
                var settled = false
                // Hand the element to a registered receiver, or offer it, under one lock.
                let (sendID, result) = try append(element, mode: .handoffOrOffer(waiter, case: 0), own: nil)
                switch result {
                case .appended: fired = true; settled = true
                case .offered: offer = sendID
                case .ownClaimed, .refused: settled = true
                }
                try await waitForCounterpart(waiter, ringing: log.writable, settled: settled, until: deadline)
            } catch {
                failure = error
            }
            let claimed = table.finish(waiter)
            do {
                if !fired, claimed != nil, let sendID = offer {
                    offer = nil
                    // Taken unless it can still be withdrawn (the receiver died before taking it).
                    fired = try !log.withdraw(sendID: sendID)
                }
                if let sendID = offer { _ = try log.withdraw(sendID: sendID) }
            } catch {
                table.end(waiter)
                throw error
            }
            table.end(waiter)
            if fired { return }
            try goRoundAgain(after: failure, deadline: deadline)
        }
    }
}
