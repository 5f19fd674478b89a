@testable import Baton
import Foundation
import Synchronization
import BatonTestSupport
import Testing

@Suite("Channels", .serialized)
struct ChannelTests {
    // MARK: Across processes

    @Test("4 producer and 4 consumer processes move 100,000 elements: none lost, none duplicated")
    func manyProducersAndConsumers() async throws {
        let directory = try TemporaryContainer()
        let perProducer = 25_000
        let capacity = "bounded:256"
        let consumers = try (0..<4).map { _ in
            try ChildProcess(harness: ["channel", "test-worker", "consume", "bulk", "--capacity", capacity], container: directory.path)
        }
        for consumer in consumers { try await consumer.line(timeout: 30) { $0 == "ready" } }
        let producers = try (0..<4).map { index in
            try ChildProcess(harness: ["channel", "test-worker", "produce", "bulk", "--capacity", capacity,
                              "--from", String(index * perProducer), "--count", String(perProducer)], container: directory.path)
        }
        for producer in producers {
            try await producer.line(timeout: 120) { $0.hasPrefix("sent") }
            #expect(try await producer.wait() == 0)
        }
        let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "bulk", capacity: .bounded(256))
        try channel.close()
        var received: [Int] = []
        var reported = 0
        for consumer in consumers {
            let done = try await consumer.line(timeout: 60) { $0.hasPrefix("done ") }
            reported += Int(done.dropFirst(5)) ?? -1
            #expect(try await consumer.wait() == 0)
            for line in consumer.lines where line.hasPrefix("got ") {
                received.append(contentsOf: line.dropFirst(4).split(separator: ",").map { Int($0)! })
            }
        }
        #expect(received.count == 4 * perProducer)
        #expect(reported == 4 * perProducer)
        #expect(Set(received).count == received.count, "an element was delivered twice")
        #expect(Set(received) == Set(0..<(4 * perProducer)), "an element was lost")
    }

    @Test("a sender asleep on a full channel wakes when the receiver that made room dies right after its acknowledgement")
    func noLostWakeUpWhenReceiverDiesAfterAcknowledging() async throws {
        let directory = try TemporaryContainer()
        let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "full", capacity: .bounded(1))
        try await channel.send(1)
        for round in 0..<3 {
            // The sender goes to sleep first (the channel is full), then the receiver makes room
            // and is killed the moment its acknowledgement releases the lock.
            let sending = Task { try await channel.send(round + 2, deadline: .after(.seconds(60))) }
            try await Task.sleep(for: .milliseconds(300))
            let receiver = try ChildProcess(harness: ["channel", "test-worker", "receive-and-die", "full"], container: directory.path)
            try await receiver.line(timeout: 30) { $0 == "ready" }
            try await within(15, "the blocked send after the receiver's acknowledgement") { try await sending.value }
            _ = try await receiver.wait()
        }
        #expect(try channel.tryReceive() == 4)
    }

    /// Doorbells ring just after the unlock (a woken waiter never finds the lock still held); the
    /// rings are recorded as owed first, so a process killed between its unlock and its rings
    /// leaves them to the next operation on the channel, which makes them.
    @Test("a receiver killed between its unlock and its ring: the next operation on the channel makes the ring it owed")
    func owedRingIsMadeByTheNextHolder() async throws {
        let directory = try TemporaryContainer()
        let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "owed", capacity: .bounded(1))
        try await channel.send(1)
        let sending = Task { try await channel.send(2, deadline: .after(.seconds(120))) }
        try await Task.sleep(for: .milliseconds(300))
        let receiver = try ChildProcess(harness: ["channel", "test-worker", "receive-and-die-before-ring", "owed"], container: directory.path)
        try await receiver.line(timeout: 30) { $0 == "ready" }
        #expect(try await receiver.wait() == 128 + SIGKILL)
        // The sender sleeps on: the ring that would wake it was not made. The next operation
        // (here, a receive that finds the channel empty) makes it.
        #expect(try channel.tryReceive() == nil)
        try await within(15, "the blocked send after the next operation made the owed ring") { try await sending.value }
        #expect(try channel.tryReceive() == 2)
    }

    /// Header words outside the header's checksum, forged (offset in the file, value).
    static let forgedWords: [(name: String, offset: Int, value: UInt64)] = [
        ("head far past the data", 152, 1 << 40), ("head negative", 152, UInt64(bitPattern: -64)),
        ("head misaligned", 152, 3), ("tail far past the data", 160, 1 << 50), ("tail misaligned", 160, 1_001),
        ("tail negative", 160, UInt64(bitPattern: -8)), ("data size huge", 168, 1 << 45), ("data size zero", 168, 0),
        ("data size misaligned", 168, 100_003), ("ready count negative", 176, UInt64(bitPattern: -5)),
        ("taken count huge", 184, 1 << 62), ("waiting receivers huge", 208, UInt64.max),
        // Possible values, which only the seal tells from the real ones (each element here is
        // one 48-byte frame: 40 bytes of header and "1"): before it, these lost elements.
        ("head one frame on", 152, 48), ("head two frames on", 152, 96), ("tail one frame back", 160, 96),
        ("tail at the head", 160, 0), ("ready count zero", 176, 0), ("taken count one", 184, 1),
        ("next take id back", 200, 0), ("layout epoch moved", 216, 7),
    ]

    @Test("a forged header word never crashes a receiver, and the sent elements still arrive", arguments: 0..<forgedWords.count)
    func forgedHeaderWord(_ index: Int) async throws {
        let forged = Self.forgedWords[index]
        let directory = try TemporaryContainer()
        do {
            let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "forged", capacity: .unbounded)
            for value in 1...3 { try await channel.send(value) }
        }
        let fd = open(directory.path + "/.baton/channels/forged", O_RDWR | O_CLOEXEC)
        #expect(fd >= 0)
        var value = forged.value.littleEndian
        #expect(pwrite(fd, &value, 8, off_t(forged.offset)) == 8)
        close(fd)
        let received = try await runBaton(["channel", "receive", "forged", "--count", "3", "--timeout", "5"], container: directory.path)
        #expect(received.status < 128, "\(forged.name): exit \(received.status) \(received.errors)")
        #expect(received.lines == ["1", "2", "3"], "\(forged.name): \(received.lines) \(received.errors)")
        // And the channel goes on.
        #expect(try await runBaton(["channel", "send", "forged", "4"], container: directory.path).status == 0)
        #expect(try await runBaton(["channel", "receive", "forged", "--count", "1", "--timeout", "5"], container: directory.path).lines == ["4"])
    }

    /// Sends 1, 2, 3 to a new channel "forged" and closes it; returns the channel file's path.
    static func threeElements(_ directory: TemporaryContainer) async throws -> String {
        let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "forged", capacity: .unbounded)
        for value in 1...3 { try await channel.send(value) }
        return directory.path + "/.baton/channels/forged"
    }

    static func pwrite32(_ file: String, _ value: UInt32, at offset: Int) {
        let fd = open(file, O_RDWR | O_CLOEXEC)
        var bytes = value.littleEndian
        #expect(pwrite(fd, &bytes, 4, off_t(offset)) == 4)
        close(fd)
    }

    /// Receives until empty, counting the damage reports (malformedFrame, corrupt) on the way.
    static func drain(_ channel: SharedChannel<Int>) throws -> (values: [Int], reports: [String]) {
        var values: [Int] = [], reports: [String] = []
        for _ in 0..<10 {
            do {
                guard let value = try channel.tryReceive() else { break }
                values.append(value)
            } catch let error as BatonError where error.code == .malformedFrame || error.code == .corrupt {
                reports.append(error.message)
            }
        }
        return (values, reports)
    }

    @Test("a frame marked done or taken by another program is reported, or returned to the channel, never lost silently")
    func forgedFrameState() async throws {
        // Frame 2 starts at 4096 + 48; its state word is the first 4 bytes (0 ready, 1 taken, 2 done).
        // Marked done: lost, and said. Marked taken (by receiver slot 0, free here): returned to
        // the channel like a dead receiver's take, nothing lost.
        for (state, expected, reported) in [(UInt32(2), [1, 3], 1), (UInt32(1), [1, 2, 3], 0)] {
            let directory = try TemporaryContainer()
            let file = try await Self.threeElements(directory)
            Self.pwrite32(file, state, at: 4096 + 48)
            let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "forged", capacity: .unbounded)
            let (values, reports) = try Self.drain(channel)
            #expect(values.sorted() == expected, "state \(state): \(values) \(reports)")
            #expect(reports.count == reported, "state \(state): \(reports)")
            try await channel.send(4)
            #expect(try channel.tryReceive() == 4)
        }
        // Marked taken by a receiver slot that a live process holds, with no take id: returned.
        let directory = try TemporaryContainer()
        let file = try await Self.threeElements(directory)
        let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "forged", capacity: .unbounded)
        #expect(try channel.tryReceive() == 1)
        Self.pwrite32(file, 1, at: 4096 + 96)
        let (values, reports) = try Self.drain(channel)
        #expect(values == [2, 3], "\(values) \(reports)")
        #expect(reports.count == 1 && reports.first?.contains("no receiver took") == true, "\(reports)")
    }

    @Test("a seal that fails its checksum is said once to the next caller; the channel goes on from its words")
    func brokenSeal() async throws {
        let directory = try TemporaryContainer()
        let file = try await Self.threeElements(directory)
        Self.pwrite32(file, 0xDEAD_BEEF, at: 4088)
        let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "forged", capacity: .unbounded)
        let (values, reports) = try Self.drain(channel)
        #expect(values == [1, 2, 3])
        #expect(reports.count == 1 && reports.first?.contains("seal") == true, "\(reports)")
    }

    @Test("a receiver does not wait for ever on a lock holder that is stopped (SIGSTOP) but alive")
    func stoppedLockHolderIsNotWaitedForEver() async throws {
        let directory = try TemporaryContainer()
        _ = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "stuck", capacity: .unbounded)
        let holder = try ChildProcess(harness: ["channel", "test-worker", "hold-lock", "stuck"], container: directory.path)
        try await holder.line(timeout: 30) { $0 == "locked" }
        holder.signal(SIGSTOP)
        defer { holder.signal(SIGKILL) }
        let receiver = try ChildProcess(["channel", "receive", "stuck", "--timeout", "1"], container: directory.path)
        let status = try await receiver.wait(timeout: 60)
        #expect(status > 0 && status < 128, "exit \(status): \(receiver.errorLines)")
        #expect(receiver.errorLines.joined().contains("busy"), "\(receiver.errorLines)")
    }

    @Test("an unbounded channel grows while another process reads it, and keeps one producer's order")
    func unboundedGrowsAcrossProcesses() async throws {
        let directory = try TemporaryContainer()
        let count = 30_000
        let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "log", capacity: .unbounded)
        let producer = try ChildProcess(harness: ["channel", "test-worker", "produce", "log", "--capacity", "unbounded",
                                         "--from", "0", "--count", String(count)], container: directory.path)
        var received: [Int] = []
        // Read slowly at first so the backlog grows the file (it starts at 64 KiB).
        try await producer.line(timeout: 60) { $0.hasPrefix("sent") }
        let size = try FileManager.default.attributesOfItem(atPath: directory.path + "/.baton/channels/log")[.size] as? Int ?? 0
        #expect(size > 1 << 20, "the backlog did not grow the file")
        while received.count < count, let value = try await channel.receive(deadline: .after(.seconds(30))) {
            received.append(value)
        }
        #expect(received == Array(0..<count))
        #expect(try await producer.wait() == 0)
        // The emptied file's space is reused: more elements go through without growing it.
        for value in 0..<1_000 { try await channel.send(value) }
        for value in 0..<1_000 { #expect(try channel.tryReceive() == value) }
        let after = try FileManager.default.attributesOfItem(atPath: directory.path + "/.baton/channels/log")[.size] as? Int ?? 0
        #expect(after == size)
    }

    @Test("a rendezvous send returns only after a receiver took the element")
    func rendezvousWaitsForReceiver() async throws {
        let directory = try TemporaryContainer()
        let sender = try ChildProcess(["channel", "send", "meet", "\"hello\"", "--capacity", "rendezvous"], container: directory.path)
        let channel = try SharedChannel<String>(SharedContainer(path: directory.path), name: "meet", capacity: .rendezvous)
        // Nobody received yet: the sender must still be waiting, however long we give it.
        await #expect(throws: (any Error).self) { try await sender.wait(timeout: 0.5) }
        #expect(try await channel.receive(deadline: .after(.seconds(20))) == "hello")
        #expect(try await sender.wait() == 0)

        // In process: the send has not returned before the receive.
        let local = SharedChannel<Int>(capacity: .rendezvous)
        let returned = Mutex(false)
        let sending = Task {
            try await local.send(7)
            returned.withLock { $0 = true }
        }
        try await Task.sleep(for: .milliseconds(100))
        #expect(returned.withLock { $0 } == false)
        #expect(try await local.receive() == 7)
        try await sending.value
        #expect(returned.withLock { $0 })
    }

    @Test("String, [UInt8] and Data elements cross processes byte for byte and in order")
    func rawElementsCrossProcesses() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let count = 2_000
        // Open before the producer so both see the same (unbounded) channels.
        let data = try SharedChannel<Data>(container, name: "raw", capacity: .unbounded)
        let texts = try SharedChannel<String>(container, name: "raw-text", capacity: .unbounded)
        let producer = try ChildProcess(harness: ["channel", "test-worker", "produce-raw", "raw", "--count", String(count)], container: directory.path)
        for index in 0..<count {
            let element = try await data.receive(deadline: .after(.seconds(30)))
            let expected = Data((0..<(index % 300)).map { UInt8(truncatingIfNeeded: index + $0) })
            guard element == expected else {
                Issue.record("byte element \(index) arrived as \(element.map { "\($0.count) bytes" } ?? "nil")")
                return
            }
        }
        for index in 0..<count {
            let element = try await texts.receive(deadline: .after(.seconds(30)))
            let expected = "\(index):" + String(repeating: "é✓x", count: index % 40)
            guard element == expected else {
                Issue.record("text element \(index) arrived as \(element ?? "nil")")
                return
            }
        }
        try await producer.line(timeout: 30) { $0 == "sent" }
        #expect(try await producer.wait() == 0)
        #expect(try data.tryReceive() == nil)
        #expect(try texts.tryReceive() == nil)
        // A [UInt8] reader of the same channel gets the same bytes.
        let bytes = try SharedChannel<[UInt8]>(container, name: "raw", capacity: .unbounded)
        try await bytes.send([1, 2, 3])
        #expect(try await data.receive() == Data([1, 2, 3]))
        try await data.send(Data([4, 5]))
        #expect(try await bytes.receive() == [4, 5])
    }

    @Test("rendezvous round trips with another process lose no wake-up, whether the waiters spin or sleep")
    func rendezvousRoundTripsLoseNoWakeUp() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let requests = try SharedChannel<String>(container, name: "requests", capacity: .rendezvous)
        let replies = try SharedChannel<String>(container, name: "replies", capacity: .rendezvous)
        let echo = try ChildProcess(harness: ["channel", "test-worker", "echo-text", "requests", "replies"], container: directory.path)
        try await echo.line(timeout: 30) { $0 == "ready" }
        for round in 0..<1_000 {
            // Now and then a pause far longer than any spin, so that the other side's wait
            // (and then this side's) goes to sleep in the kernel and must be woken.
            if round % 50 == 49 { try await Task.sleep(for: .milliseconds(3)) }
            try await requests.send("r\(round)", deadline: .after(.seconds(30)))
            if round % 50 == 24 {
                // The echo's reply waits for this receive: let it fall asleep first.
                try await Task.sleep(for: .milliseconds(3))
            }
            #expect(try await replies.receive(deadline: .after(.seconds(30))) == "r\(round)")
        }
        try requests.close()
        try await echo.line(timeout: 30) { $0 == "done" }
        #expect(try await echo.wait() == 0)
    }

    @Test("a sender blocked on a full bounded channel in another process resumes when room is made")
    func blockedSenderResumes() async throws {
        let directory = try TemporaryContainer()
        let channel = try SharedChannel<String>(SharedContainer(path: directory.path), name: "narrow", capacity: .bounded(1))
        try await channel.send("a")
        let sender = try ChildProcess(["channel", "send", "narrow", "\"b\""], container: directory.path)
        // Give the sender time to find the channel full and fall asleep (not an assertion).
        try await Task.sleep(for: .milliseconds(200))
        #expect(try await channel.receive(deadline: .after(.seconds(20))) == "a")
        #expect(try await sender.wait() == 0)
        #expect(try await channel.receive(deadline: .after(.seconds(20))) == "b")
    }

    @Test("close: receivers get the remaining elements, then the end; a later send throws closed")
    func closeDrains() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let channel = try SharedChannel<String>(container, name: "drain", capacity: .unbounded)
        for text in ["a", "b", "c"] { try await channel.send(text) }
        try channel.close()
        let (status, lines, _) = try await runBaton(["channel", "receive", "drain", "--timeout", "20"], container: directory.path)
        #expect(status == 0)
        #expect(lines == ["\"a\"", "\"b\"", "\"c\""])
        #expect(try await channel.receive(deadline: .after(.seconds(5))) == nil)
        await #expect { try await channel.send("d") } throws: { ($0 as? BatonError)?.code == .closed }
        #expect(try await runBaton(["channel", "send", "drain", "\"e\""], container: directory.path).status == 5)

        // A receiver already waiting ends when the channel closes.
        let local = SharedChannel<Int>(capacity: .bounded(4))
        try await local.send(1)
        let receiving = Task { () -> [Int] in
            var values: [Int] = []
            for try await value in local { values.append(value) }
            return values
        }
        try await Task.sleep(for: .milliseconds(50))
        try local.close()
        #expect(try await receiving.value == [1])
    }

    @Test("a consumer killed with SIGKILL after taking an element loses nothing")
    func killedConsumerLosesNothing() async throws {
        let directory = try TemporaryContainer()
        let channel = try SharedChannel<String>(SharedContainer(path: directory.path), name: "jobs", capacity: .bounded(8))
        try await channel.send("precious")
        try await channel.send("second")
        let holder = try ChildProcess(harness: ["channel", "test-worker", "hold", "jobs"], container: directory.path)
        let taken = try await holder.line(timeout: 30) { $0.hasPrefix("taken ") }
        #expect(taken == "taken \"precious\"")
        // The taken element is not offered to anyone else while its taker lives.
        #expect(try channel.tryReceive() == "second")
        #expect(try channel.tryReceive() == nil)
        // This receive waits; the taker's death (seen by the kernel) gives the element back.
        let receiving = Task { try await channel.receive(deadline: .after(.seconds(30))) }
        try await Task.sleep(for: .milliseconds(100))
        holder.signal(SIGKILL)
        #expect(try await holder.wait() == 128 + SIGKILL)
        #expect(try await receiving.value == "precious")
        #expect(try channel.tryReceive() == nil)
    }

    /// A counterpart checks a waiting receiver's liveness at most once per liveness window
    /// (``ChannelWaiterTable``): a receiver killed inside the window still looks alive, so a send
    /// hands it the element. That element is an orphan the next receiver takes. The window is
    /// made long here so that the kill surely falls inside it.
    @Test("a send to a receiver killed inside the liveness window is not lost: the next receiver gets it")
    func aReceiverKilledInsideTheLivenessWindowLosesNothing() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let channel = try SharedChannel<String>(container, name: "meet", capacity: .rendezvous)
        try container.channelWaiters.livenessWindow.store(.max, ordering: .relaxed)
        let receiver = try ChildProcess(["channel", "receive", "meet", "--capacity", "rendezvous", "--count", "2", "--timeout", "60"], container: directory.path)
        func waitForRegistration() async throws {
            let start = ContinuousClock.now
            while try channel.log.registeredReceiverCount() == 0, ContinuousClock.now - start < .seconds(30) {
                try await Task.sleep(for: .milliseconds(5))
            }
            #expect(try channel.log.registeredReceiverCount() == 1)
        }
        // The first send claims the registered receiver: this process has now seen it alive.
        try await waitForRegistration()
        #expect(try channel.trySend("first"))
        #expect(try await receiver.line(timeout: 30) { _ in true } == "\"first\"")
        // Killed while registered for its second value.
        try await waitForRegistration()
        receiver.signal(SIGKILL)
        #expect(try await receiver.wait() == 128 + SIGKILL)
        // Still alive to this process: the send hands the element to the dead receiver's registration.
        #expect(try channel.trySend("second"), "the send checked the receiver's liveness again inside the window")
        // Nothing is lost: the next receiver takes the orphan, even one in this process, where
        // the dead receiver still counts as alive (whether an element is an orphan is checked
        // afresh).
        #expect(try await channel.receive(deadline: .after(.seconds(10))) == "second")
        #expect(try channel.tryReceive() == nil)
    }

    @Test("a process killed while holding the channel's mutex does not wedge or damage the channel")
    func killedLockHolder() async throws {
        let directory = try TemporaryContainer()
        let channel = try SharedChannel<Int>(SharedContainer(path: directory.path), name: "robust", capacity: .unbounded)
        try await channel.send(1)
        try await channel.send(2)
        let holder = try ChildProcess(harness: ["channel", "test-worker", "hold-lock", "robust"], container: directory.path)
        try await holder.line(timeout: 30) { $0 == "locked" }
        holder.signal(SIGKILL)
        #expect(try await holder.wait() == 128 + SIGKILL)
        // The next locker gets EOWNERDEAD, checks the log, and goes on.
        #expect(try await channel.receive(deadline: .after(.seconds(20))) == 1)
        try await channel.send(3)
        #expect(try channel.tryReceive() == 2)
        #expect(try channel.tryReceive() == 3)
        #expect(try channel.tryReceive() == nil)
    }

    // MARK: Select

    @Test("select takes exactly one case")
    func selectTakesExactlyOne() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let a = try SharedChannel<Int>(container, name: "a", capacity: .unbounded)
        let b = try SharedChannel<String>(container, name: "b", capacity: .bounded(1))
        for round in 0..<20 {
            try await a.send(round)
            try await b.send("b\(round)")
            let fired = try await select(
                .receive(from: a) { value in "a:\(value!)" },
                .receive(from: b) { value in "b:\(value!)" },
                deadline: .after(.seconds(10)))
            if fired.hasPrefix("a:") {
                #expect(fired == "a:\(round)")
                #expect(try b.tryReceive() == "b\(round)")
            } else {
                #expect(fired == "b:b\(round)")
                #expect(try a.tryReceive() == round)
            }
            #expect(try a.tryReceive() == nil)
            #expect(try b.tryReceive() == nil)
        }

        // Nothing possible: the select times out and changes nothing.
        try await b.send("full")
        await #expect { try await select(
            .receive(from: a) { _ in 1 },
            .send("more", to: b) { 2 },
            deadline: .after(.milliseconds(200)))
        } throws: { ($0 as? BatonError)?.code == .timedOut }
        #expect(try a.tryReceive() == nil)
        #expect(try b.tryReceive() == "full")
        #expect(try b.tryReceive() == nil)

        // Only the receive is possible: it fires, and the full channel is untouched.
        try await b.send("again")
        try await a.send(99)
        let fired = try await select(
            .send("new", to: b) { "sent" },
            .receive(from: a) { value in "a:\(value!)" },
            deadline: .after(.seconds(10)))
        #expect(fired == "a:99")
        #expect(try b.tryReceive() == "again")
        #expect(try b.tryReceive() == nil)

        // A send case fires once another process makes room.
        try await b.send("blocking")
        let receiver = try ChildProcess(["channel", "receive", "b", "--count", "2", "--timeout", "30"], container: directory.path)
        let sent = try await select(.send("new", to: b) { "sent" }, deadline: .after(.seconds(30)))
        #expect(sent == "sent")
        try await receiver.line(timeout: 30) { $0 == "\"new\"" }
        #expect(receiver.lines == ["\"blocking\"", "\"new\""])
    }

    @Test("select offers a rendezvous send to a receiver in another process, and withdraws it on timeout")
    func selectRendezvous() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let meet = try SharedChannel<String>(container, name: "meet", capacity: .rendezvous)
        let idle = try SharedChannel<Int>(container, name: "idle", capacity: .unbounded)
        await #expect { try await select(
            .send("nobody", to: meet) { "sent" },
            .receive(from: idle) { _ in "idle" },
            deadline: .after(.milliseconds(300)))
        } throws: { ($0 as? BatonError)?.code == .timedOut }
        #expect(try meet.tryReceive() == nil, "a withdrawn offer stayed in the channel")

        let receiver = try ChildProcess(["channel", "receive", "meet", "--count", "1", "--timeout", "30"], container: directory.path)
        let fired = try await select(
            .send("offered", to: meet) { "sent" },
            .receive(from: idle) { _ in "idle" },
            deadline: .after(.seconds(30)))
        #expect(fired == "sent")
        #expect(try await receiver.line(timeout: 30) == "\"offered\"")
        #expect(try await receiver.wait() == 0)
        #expect(try idle.tryReceive() == nil)
    }

    // MARK: Damage and cancellation

    @Test("a malformed frame is rejected with a clear error and the channel goes on")
    func malformedFrameIsSkipped() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let path = directory.path + "/.baton/channels/damaged"
        let channel = try SharedChannel<String>(container, name: "damaged", capacity: .unbounded)
        try await channel.send("first")
        try await channel.send("CORRUPT-ME-payload")
        try await channel.send("third")
        try damage(path, marker: "CORRUPT-ME", at: 0) // a payload byte: the CRC-32C fails
        #expect(try await channel.receive() == "first")
        await #expect { try await channel.receive() } throws: { ($0 as? BatonError)?.code == .malformedFrame }
        #expect(try await channel.receive() == "third")

        // A damaged frame header (its tag): the receiver resynchronises on the next frame.
        try await channel.send("one")
        try await channel.send("TAG-BREAK")
        try await channel.send("three")
        try damage(path, marker: "TAG-BREAK", at: -24) // the tag: 24 bytes before the payload
        let (status, lines, _) = try await runBaton(["channel", "receive", "damaged", "--count", "3", "--timeout", "2"], container: directory.path)
        #expect(lines == ["\"one\"", "\"three\""])
        #expect(status == 3) // only two elements were left
        try await channel.send("after")
        #expect(try await channel.receive(deadline: .after(.seconds(5))) == "after")

        // A JSON-coded element that does not decode as the receiver's type is rejected, not fatal.
        let structs = try SharedChannel<Point>(container, name: "points", capacity: .unbounded)
        try await structs.send(Point(x: 1, y: 2))
        let strings = try SharedChannel<Int>(container, name: "points", capacity: .unbounded)
        await #expect { try await strings.receive() } throws: { ($0 as? BatonError)?.code == .malformedFrame }
        try await structs.send(Point(x: 3, y: 4))
        #expect(try await structs.receive() == Point(x: 3, y: 4))
    }

    struct Point: Codable, Sendable, Equatable {
        var x: Int
        var y: Int
    }

    /// Flips one byte of the channel file at `offset` from the first occurrence of `marker`
    /// (a `String` element is stored as UTF-8 text, so the marker starts the payload).
    private func damage(_ path: String, marker: String, at offset: Int) throws {
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))
        let needle = Array(marker.utf8)
        let start = try #require((0...(bytes.count - needle.count)).first { Array(bytes[$0..<($0 + needle.count)]) == needle })
        bytes[start + offset] ^= 0x5A
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        try handle.seek(toOffset: UInt64(start + offset))
        try handle.write(contentsOf: [bytes[start + offset]])
        try handle.close()
    }

    @Test("a cancelled or timed-out wait leaves the channel exactly as it was")
    func cancellationLeavesChannelIntact() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        for (name, full) in [("file", try SharedChannel<Int>(container, name: "full", capacity: .bounded(1))),
                             ("memory", SharedChannel<Int>(capacity: .bounded(1)))] {
            try await full.send(1)
            let blocked = Task { try await full.send(2) }
            try await Task.sleep(for: .milliseconds(50))
            blocked.cancel()
            await #expect(throws: CancellationError.self, "\(name)") { try await blocked.value }
            await #expect { try await full.send(3, deadline: .after(.milliseconds(50))) } throws: { ($0 as? BatonError)?.code == .timedOut }
            #expect(try full.tryReceive() == 1)
            #expect(try full.tryReceive() == nil, "a cancelled send left its element (\(name))")

            let receiving = Task { try await full.receive() }
            try await Task.sleep(for: .milliseconds(50))
            receiving.cancel()
            await #expect(throws: CancellationError.self) { _ = try await receiving.value }
            try await full.send(5)
            #expect(try full.tryReceive() == 5, "a cancelled receive took an element (\(name))")
        }

        let meet = try SharedChannel<Int>(container, name: "meet", capacity: .rendezvous)
        let offering = Task { try await meet.send(9) }
        try await Task.sleep(for: .milliseconds(50))
        offering.cancel()
        await #expect(throws: CancellationError.self) { try await offering.value }
        #expect(try meet.tryReceive() == nil, "a cancelled rendezvous send left its element")
        #expect(try meet.trySend(1) == false, "rendezvous trySend succeeded without a waiting receiver")
        // A rendezvous receive that times out or is cancelled withdraws its registration.
        await #expect { _ = try await meet.receive(deadline: .after(.milliseconds(50))) } throws: { ($0 as? BatonError)?.code == .timedOut }
        let waitingReceive = Task { try await meet.receive() }
        try await Task.sleep(for: .milliseconds(50))
        waitingReceive.cancel()
        await #expect(throws: CancellationError.self) { _ = try await waitingReceive.value }
        #expect(try meet.log.registeredReceiverCount() == 0, "a timed-out or cancelled rendezvous receive stayed registered")
    }

    // MARK: In process

    @Test("in process: 4 sending and 4 receiving tasks, every element exactly once")
    func inProcessManyToMany() async throws {
        for capacity in [ChannelCapacity.rendezvous, .bounded(16), .unbounded] {
            let channel = SharedChannel<Int>(capacity: capacity)
            let perSender = capacity == .rendezvous ? 500 : 5_000
            let received = try await withThrowingTaskGroup(of: [Int].self) { group in
                for sender in 0..<4 {
                    group.addTask {
                        for value in (sender * perSender)..<((sender + 1) * perSender) { try await channel.send(value) }
                        return []
                    }
                }
                for _ in 0..<4 {
                    group.addTask {
                        var values: [Int] = []
                        while let value = try await channel.receive(deadline: .after(.seconds(60))) { values.append(value) }
                        return values
                    }
                }
                var all: [Int] = []
                var sendersDone = 0
                while let values = try await group.next() {
                    if values.isEmpty {
                        sendersDone += 1
                        if sendersDone == 4 { try channel.close() }
                    }
                    all.append(contentsOf: values)
                }
                return all
            }
            #expect(received.sorted() == Array(0..<(4 * perSender)), "\(capacity)")
        }
    }
}
