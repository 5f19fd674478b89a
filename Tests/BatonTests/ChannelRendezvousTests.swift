import Baton
import Foundation
import BatonTestSupport
import Testing

/// Go's semantics for rendezvous (capacity 0) channels across processes: a send completes only
/// when a receiver takes that element, a select completes exactly one case and never matches
/// itself (issue 16, finding 5).
@Suite("Channel rendezvous", .serialized)
struct ChannelRendezvousTests {
    @Test("a select receiving from rendezvous x and y in another process accepts exactly one of x.trySend and y.trySend")
    func selectAcceptsOneTrySend() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let x = try SharedChannel<Int>(container, name: "x", capacity: .rendezvous)
        let y = try SharedChannel<Int>(container, name: "y", capacity: .rendezvous)
        for round in 0..<5 {
            let selecter = try ChildProcess(harness: ["channel", "test-worker", "select-receive", "x", "y"], container: directory.path)
            try await selecter.line(timeout: 30) { $0 == "ready" }
            // Until the select waits: then exactly one of the two may succeed.
            var sent = (x: false, y: false)
            let start = ContinuousClock.now
            while !sent.x && !sent.y && ContinuousClock.now - start < .seconds(40) {
                sent.x = try x.trySend(10 * round + 1)
                sent.y = try y.trySend(10 * round + 2)
                if !sent.x && !sent.y { try await Task.sleep(for: .milliseconds(2)) }
            }
            #expect(sent.x != sent.y, "round \(round): x.trySend \(sent.x), y.trySend \(sent.y)")
            let got = try await selecter.line(timeout: 60) { $0.hasPrefix("got ") || $0 == "timeout" }
            #expect(got == (sent.x ? "got x \(10 * round + 1)" : "got y \(10 * round + 2)"), "round \(round)")
            #expect(try await selecter.wait() == 0)
            #expect(try x.tryReceive() == nil, "round \(round): x holds an element")
            #expect(try y.tryReceive() == nil, "round \(round): y holds an element")
        }
    }

    @Test("a select sending on and receiving from one rendezvous channel never matches itself")
    func selectDoesNotMatchItself() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let c = try SharedChannel<String>(container, name: "c", capacity: .rendezvous)
        func both(_ deadline: Deadline) async throws -> String {
            try await select(
                .send("mine", to: c) { "sent" },
                .receive(from: c) { value in "received \(value ?? "end")" },
                deadline: deadline)
        }
        await #expect { try await both(.after(.milliseconds(400))) } throws: { ($0 as? BatonError)?.code == .timedOut }
        #expect(try c.tryReceive() == nil, "the select left its element in the channel")
        #expect(try c.trySend("stray") == false, "the select still counts as a waiting receiver")

        // Another process receives: the send case fires.
        let receiver = try ChildProcess(["channel", "receive", "c", "--count", "1", "--timeout", "30"], container: directory.path)
        #expect(try await both(.after(.seconds(30))) == "sent")
        #expect(try await receiver.line(timeout: 30) == "\"mine\"")
        #expect(try await receiver.wait() == 0)

        // Another process sends: the receive case fires.
        let sender = try ChildProcess(["channel", "send", "c", "\"theirs\"", "--timeout", "30"], container: directory.path)
        #expect(try await both(.after(.seconds(30))) == "received theirs")
        #expect(try await sender.wait() == 0)
        #expect(try c.tryReceive() == nil)
    }

    @Test("a rendezvous send that timed out, or whose process was killed, leaves nothing for a later receiver")
    func abandonedSendLeavesNothing() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let c = try SharedChannel<String>(container, name: "c", capacity: .rendezvous)
        let timedOut = try ChildProcess(["channel", "send", "c", "\"late\"", "--timeout", "0.3"], container: directory.path)
        let timedOutStatus = try await timedOut.wait()
        #expect(timedOutStatus == 3, "send exited \(timedOutStatus); said \(timedOut.lines), stderr \(timedOut.errorLines)") // timed out (ExitStatus.timedOut)
        #expect(try c.tryReceive() == nil, "a timed-out send left its element")
        await #expect { try await c.receive(deadline: .after(.milliseconds(300))) } throws: { ($0 as? BatonError)?.code == .timedOut }

        // A sender killed while it waits for a receiver: its element was never sent.
        let killed = try ChildProcess(["channel", "send", "c", "\"ghost\"", "--timeout", "60"], container: directory.path)
        try await Task.sleep(for: .milliseconds(500))
        killed.signal(SIGKILL)
        let killedStatus = try await killed.wait()
        #expect(killedStatus == 128 + SIGKILL, "send exited \(killedStatus); said \(killed.lines), stderr \(killed.errorLines)")
        #expect(try c.tryReceive() == nil, "the element of a killed sender was delivered")

        // A receiver killed while it waits no longer counts as waiting.
        let receiver = try ChildProcess(["channel", "receive", "c", "--timeout", "60"], container: directory.path)
        try await Task.sleep(for: .milliseconds(500))
        receiver.signal(SIGKILL)
        let receiverStatus = try await receiver.wait()
        #expect(receiverStatus == 128 + SIGKILL, "receive exited \(receiverStatus); said \(receiver.lines), stderr \(receiver.errorLines)")
        #expect(try c.trySend("nobody") == false, "trySend succeeded with no live receiver")
        #expect(try c.tryReceive() == nil)
    }

    @Test("selecters killed with SIGKILL while others send: every acknowledged element is delivered exactly once, and nothing stays in the channels")
    func killedSelectersLoseNothing() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let x = try SharedChannel<Int>(container, name: "x", capacity: .rendezvous)
        let y = try SharedChannel<Int>(container, name: "y", capacity: .rendezvous)
        let perSender = 1_000
        var senders: [ChildProcess] = []
        var selecters: [ChildProcess] = []
        var ended = Set<Int>() // indices of selecters killed or exited
        var kills = 0
        let start = ContinuousClock.now
        // Kills happen only while senders send. On a loaded runner this process's loop can fall
        // behind the senders (they were done after 1 kill): then another pair of senders (new
        // values) keeps the elements flowing until 5 selecters were killed.
        repeat {
            let first = senders.count
            senders += try (first..<(first + 2)).map { index in
                try ChildProcess(harness: ["channel", "test-worker", "offer-loop", "x", "y", "--from", String(index * 10_000),
                                  "--count", String(perSender)], container: directory.path)
            }
            while senders.contains(where: { !$0.lines.contains("sent") }), ContinuousClock.now - start < .seconds(120) {
                for (index, selecter) in selecters.enumerated() where !ended.contains(index) && selecter.outputClosed {
                    _ = try await selecter.wait()
                    ended.insert(index)
                }
                while selecters.indices.filter({ !ended.contains($0) }).count < 3 {
                    selecters.append(try ChildProcess(harness: ["channel", "test-worker", "select-receive", "x", "y", "--count", "1000"], container: directory.path))
                }
                try await Task.sleep(for: .milliseconds(Int.random(in: 5...60)))
                // Kill one live selecter at a random moment of its work.
                if let victim = selecters.indices.filter({ !ended.contains($0) && selecters[$0].lines.contains("ready") }).randomElement() {
                    selecters[victim].signal(SIGKILL)
                    _ = try await selecters[victim].wait()
                    ended.insert(victim)
                    kills += 1
                }
            }
        } while kills < 5 && ContinuousClock.now - start < .seconds(120)
        for sender in senders {
            try await sender.line(timeout: 60) { $0 == "sent" }
            #expect(try await sender.wait() == 0)
        }
        for index in selecters.indices where !ended.contains(index) {
            selecters[index].signal(SIGKILL)
            _ = try await selecters[index].wait()
        }
        let acknowledged = senders.flatMap { $0.lines.filter { $0.hasPrefix("acked ") }.map { Int($0.dropFirst(6))! } }
        var delivered = selecters.flatMap { $0.lines.filter { $0.hasPrefix("got ") }.map { Int($0.split(separator: " ")[2])! } }
        // What is left: only elements handed to a selecter that died before taking them.
        var left: [Int] = []
        while let value = try x.tryReceive() { left.append(value) }
        while let value = try y.tryReceive() { left.append(value) }
        delivered += left
        #expect(acknowledged.count == senders.count * perSender)
        #expect(kills >= 5, "only \(kills) selecters were killed")
        #expect(Set(delivered).count == delivered.count, "an element was delivered twice")
        #expect(Set(delivered).isSubset(of: Set(acknowledged)), "an element that no send acknowledged was delivered")
        // A selecter killed after it took an element but before it printed it loses that one.
        let missing = Set(acknowledged).subtracting(delivered)
        #expect(missing.count <= kills, "\(missing.count) acknowledged elements lost with \(kills) kills")
        #expect(left.count <= kills, "\(left.count) elements stayed in rendezvous channels (\(kills) kills)")
        #expect(try x.trySend(-1) == false && y.trySend(-1) == false, "a dead selecter still counts as a waiting receiver")
    }

    /// Two container objects on one path (an app that drops and reopens its container, or two
    /// parts of one process): each one's rendezvous waits are recorded under its own owner token.
    @Test("a container reopened on the same path waits under its own owner token: its suspension leaves no lock under .baton")
    func reopenedContainerReleasesEveryLockWhenSuspended() async throws {
        let directory = try TemporaryContainer()
        weak var dropped: SharedContainer?
        do {
            let first = try SharedContainer(path: directory.path)
            dropped = first
            let c = try SharedChannel<String>(first, name: "c", capacity: .rendezvous)
            await #expect { try await c.receive(deadline: .after(.milliseconds(50))) } throws: { ($0 as? BatonError)?.code == .timedOut }
        }
        #expect(dropped == nil)
        let second = try SharedContainer(path: directory.path)
        let c = try SharedChannel<String>(second, name: "c", capacity: .rendezvous)
        for round in 0..<3 {
            // A rendezvous in the second container: one side waits on a waiter record.
            async let received = c.receive(deadline: .after(.seconds(30)))
            try await c.send("round \(round)", deadline: .after(.seconds(30)))
            #expect(try await received == "round \(round)")
            await #expect { try await c.receive(deadline: .after(.milliseconds(20))) } throws: { ($0 as? BatonError)?.code == .timedOut }
            await second.suspend()
            let held = ProcLocks.held(by: getpid(), under: directory.path)
            #expect(held.isEmpty, "round \(round): the suspended process holds \(held.count) lock(s) under the container: \(held)")
            try await second.resume()
        }
    }

    @Test("a container beside a suspended one on the same path meets other processes at rendezvous: its waiters live while it runs")
    func containerBesideASuspendedOneMeetsOtherProcesses() async throws {
        let directory = try TemporaryContainer()
        let first = try SharedContainer(path: directory.path)
        let firstChannel = try SharedChannel<String>(first, name: "c", capacity: .rendezvous)
        await #expect { try await firstChannel.receive(deadline: .after(.milliseconds(50))) } throws: { ($0 as? BatonError)?.code == .timedOut }
        let second = try SharedContainer(path: directory.path)
        let c = try SharedChannel<String>(second, name: "c", capacity: .rendezvous)

        // The second container's send waits (its element offered); the first container is
        // suspended meanwhile; another process receives: it must take the offer of a live waiter.
        async let sent: Void = c.send("offered", deadline: .after(.seconds(20)))
        try await Task.sleep(for: .milliseconds(300))
        await first.suspend()
        let receiver = try ChildProcess(["channel", "receive", "c", "--count", "1", "--timeout", "20"], container: directory.path)
        #expect(try await receiver.line(timeout: 30) == "\"offered\"")
        try await sent
        #expect(try await receiver.wait(timeout: 30) == 0)

        // With the first container still suspended, the second one's receiver waits for a sender
        // in another process.
        async let received = c.receive(deadline: .after(.seconds(20)))
        let sender = try ChildProcess(["channel", "send", "c", "\"theirs\"", "--timeout", "20"], container: directory.path)
        #expect(try await received == "theirs")
        #expect(try await sender.wait(timeout: 30) == 0)

        // One select waits under one container object's token: channels of two are refused.
        await #expect {
            try await select(.receive(from: firstChannel) { $0 }, .receive(from: c) { $0 }, deadline: .after(.milliseconds(20)))
        } throws: { ($0 as? BatonError)?.code == .invalidArgument }
        try await first.resume()
    }
}
