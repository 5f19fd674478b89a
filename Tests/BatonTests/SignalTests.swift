@testable import Baton
import Synchronization
import Foundation
import BatonTestSupport
import Testing

@Suite("Signals across processes")
struct SignalTests {
    @Test("a post reaches 16 watching processes")
    func postReachesSixteenWatchers() async throws {
        let directory = try TemporaryContainer()
        let watchers = try (0..<16).map { _ in
            try ChildProcess(["signal", "watch", "fanout", "--count", "1", "--timeout", "60", "--announce"], container: directory.path)
        }
        for watcher in watchers { try await watcher.line(timeout: 60) { $0 == "ready" } }
        let container = try SharedContainer(path: directory.path)
        try container.signals.post("fanout", state: 4242)
        for watcher in watchers {
            let line = try await watcher.line(timeout: 30) { $0.hasPrefix("fanout") }
            #expect(line == "fanout state=4242")
            #expect(try await watcher.wait() == 0)
        }
    }

    /// The signal table of `container`. A container object of its own has its own mapping, entry
    /// and signal thread: to the table, a process of its own.
    static func table(_ container: SharedContainer) throws -> SignalTable {
        try #require(try container.signals.backend as? SignalTable)
    }

    /// The entry's "sleeping" word of a thread asleep on the group word of `interest`'s one bit.
    static func groupWord(_ interest: UInt64) -> UInt32 {
        SignalTable.sleepsOnGroup + UInt32(interest.trailingZeroBitCount)
    }

    /// The signal threads' round counts once none of them went a round for 50 ms (a second at
    /// most): settled, before a test counts the rounds something causes.
    static func settledRounds(_ tables: SignalTable...) async throws -> [UInt64] {
        var rounds = tables.map(\.threadRounds)
        for _ in 0..<20 {
            try await Task.sleep(for: .milliseconds(50))
            let now = tables.map(\.threadRounds)
            if now == rounds { break }
            rounds = now
        }
        return rounds
    }

    /// To the table, two processes (`app` and `other`) that both observe `"role"`, asleep on its
    /// group word: the processes of a role between hand-overs.
    struct TwoAsleepOnTheGroupWord {
        let directory: TemporaryContainer
        let app: SharedContainer, other: SharedContainer
        let appTable: SignalTable, otherTable: SignalTable
        let appObservation: SignalObservation, otherObservation: SignalObservation
        /// The entry's "sleeping" word for that group word.
        let group: UInt32

        init() async throws {
            directory = try TemporaryContainer()
            app = try SharedContainer(path: directory.path)
            other = try SharedContainer(path: directory.path)
            let appTable = try SignalTests.table(app), otherTable = try SignalTests.table(other)
            (self.appTable, self.otherTable) = (appTable, otherTable)
            appObservation = try app.signals.observe("role")
            otherObservation = try other.signals.observe("role")
            let group = SignalTests.groupWord(try #require(appTable.entryForTesting).interest)
            self.group = group
            try await eventually("both asleep on the group word") {
                appTable.entryForTesting?.sleeping == group && otherTable.entryForTesting?.sleeping == group
            }
        }
    }

    /// Sleeping watchers as posters see them: each process entry in use with the word its
    /// thread may sleep on (0 awake, 1 its doorbell, 2 + b group word b) and its interest.
    static func sleepingEntries(_ path: String) throws -> [(sleeping: UInt32, interest: UInt64)] {
        let table = try Data(contentsOf: URL(fileURLWithPath: path + "/.baton/signals"))
        return (0..<64).compactMap { index in
            table.withUnsafeBytes { bytes -> (UInt32, UInt64)? in
                let base = 1024 + index * 32
                guard bytes.loadUnaligned(fromByteOffset: base + 24, as: UInt64.self) != 0 else { return nil }
                return (bytes.loadUnaligned(fromByteOffset: base + 8, as: UInt32.self), bytes.loadUnaligned(fromByteOffset: base + 16, as: UInt64.self))
            }
        }
    }

    @Test("processes that each watch one name sleep on its bit's group word: a post to eight of them is one wake call")
    func oneWakeCallForAGroup() async throws {
        let directory = try TemporaryContainer()
        let watchers = try (0..<8).map { _ in
            try ChildProcess(["signal", "watch", "group", "--count", "1", "--timeout", "60", "--announce"], container: directory.path)
        }
        defer { for watcher in watchers { watcher.signal(SIGKILL) } }
        for watcher in watchers { try await watcher.line(timeout: 60) { $0 == "ready" } }
        try await eventually("eight watchers asleep") {
            try Self.sleepingEntries(directory.path).filter { $0.sleeping != 0 }.count == 8
        }
        let entries = try Self.sleepingEntries(directory.path)
        let bit = try #require(entries.first).interest.trailingZeroBitCount
        #expect(entries.allSatisfy { $0.interest == UInt64(1) << UInt64(bit) && $0.sleeping == SignalTable.sleepsOnGroup + UInt32(bit) }, "\(entries)")
        let table = try Self.table(SharedContainer(path: directory.path))
        #expect(try table.postCountingWakes("group", state: 5) == 1)
        for watcher in watchers {
            #expect(try await watcher.line(timeout: 30) { $0.hasPrefix("group") } == "group state=5")
            #expect(try await watcher.wait() == 0)
        }
    }

    @Test("a process with names in two bits sleeps on its doorbell and is woken there; one that adds a name while asleep on a group word moves to its doorbell")
    func doorbellAndGroupSleepers() async throws {
        let directory = try TemporaryContainer()
        // To the table, three processes.
        let single = try SharedContainer(path: directory.path), double = try SharedContainer(path: directory.path)
        let singleTable = try Self.table(single), doubleTable = try Self.table(double)
        let poster = try Self.table(SharedContainer(path: directory.path))
        let singleFan = try single.signals.observe("fan")
        let doubleFan = try double.signals.observe("fan")
        let fanBit = try #require(singleTable.entryForTesting).interest
        // A second name in another bit.
        var other: (name: String, observation: SignalObservation)?
        for index in 0..<1_000 where other == nil {
            let observation = try double.signals.observe("other-\(index)")
            if try #require(doubleTable.entryForTesting).interest.nonzeroBitCount == 2 { other = ("other-\(index)", observation) }
        }
        let (otherName, doubleOther) = try #require(other)
        try await eventually("both asleep") {
            singleTable.entryForTesting?.sleeping == Self.groupWord(fanBit) && doubleTable.entryForTesting?.sleeping == SignalTable.sleepsOnDoorbell
        }
        // One group word, one doorbell.
        #expect(try poster.postCountingWakes("fan", state: 1) == 2)
        #expect(try await singleFan.next(deadline: .after(.seconds(10))).state == 1)
        #expect(try await doubleFan.next(deadline: .after(.seconds(10))).state == 1)
        #expect(try poster.postCountingWakes(otherName, state: 2) == 1)
        #expect(try await doubleOther.next(deadline: .after(.seconds(10))).state == 2)
        // The single-name process takes a name in another bit while asleep on the group word:
        // its thread goes round and sleeps on its doorbell, where posts to either name find it.
        let singleOther = try single.signals.observe(otherName)
        try await eventually("moved to its doorbell") { singleTable.entryForTesting?.sleeping == SignalTable.sleepsOnDoorbell }
        #expect(try poster.postCountingWakes(otherName, state: 3) == 2)
        #expect(try await singleOther.next(deadline: .after(.seconds(10))).state == 3)
        #expect(try await doubleOther.next(deadline: .after(.seconds(10))).state == 3)
    }

    @Test("a process that posts in the bit it observes sleeps on its doorbell: its own posts no longer wake its thread")
    func postersSleepOnTheirDoorbell() async throws {
        // Two processes that both observe and post one name, as the processes of a role do.
        let two = try await TwoAsleepOnTheGroupWord()
        let (app, other, appTable, otherTable) = (two.app, two.other, two.appTable, two.otherTable)
        let (appObservation, otherObservation, group) = (two.appObservation, two.otherObservation, two.group)
        // The first post rings the group word the poster's own thread sleeps on; the thread
        // goes round and sleeps on its doorbell from then on.
        try app.signals.post("role", state: 1)
        #expect(try await otherObservation.next(deadline: .after(.seconds(10))).state == 1)
        #expect(try await appObservation.next(deadline: .after(.seconds(10))).state == 1)
        try await eventually("the poster on its doorbell") { appTable.entryForTesting?.sleeping == SignalTable.sleepsOnDoorbell }
        #expect(otherTable.entryForTesting?.sleeping == group)
        // Its posts now wake the other process alone; its own observer still gets each one,
        // from the poster.
        for state in UInt64(2)...21 {
            let rounds = appTable.threadRounds
            #expect(try appTable.postCountingWakes("role", state: state) == 1)
            #expect(try await otherObservation.next(deadline: .after(.seconds(10))).state == state)
            #expect(try await appObservation.next(deadline: .after(.seconds(10))).state == state)
            #expect(appTable.threadRounds == rounds, "the poster's own thread went round for its own post \(state)")
        }
        // Posts of the other process reach it on its doorbell.
        try other.signals.post("role", state: 30)
        #expect(try await appObservation.next(deadline: .after(.seconds(10))).state == 30)
    }

    @Test("observing a name in a bit the process already watches wakes no thread, in it or in the other processes of the group; the new observation still gets the next post")
    func anObservationInAWatchedBitWakesNoThread() async throws {
        let two = try await TwoAsleepOnTheGroupWord()
        let (app, other, appTable, otherTable) = (two.app, two.other, two.appTable, two.otherTable)
        let (appFirst, otherObservation, group) = (two.appObservation, two.otherObservation, two.group)
        let settled = try await Self.settledRounds(appTable, otherTable)
        let (appRounds, otherRounds) = (settled[0], settled[1])
        // A second observation of the same name (a holder's stop-request watch at each grant).
        let appSecond = try app.signals.observe("role")
        try await Task.sleep(for: .milliseconds(200))
        #expect(appTable.threadRounds == appRounds, "the observing process's thread went round for the registration")
        #expect(otherTable.threadRounds == otherRounds, "the other process's thread went round for the registration")
        #expect(appTable.entryForTesting?.sleeping == group)
        // Both of its observations get the other process's next post.
        try other.signals.post("role", state: 7)
        #expect(try await appFirst.next(deadline: .after(.seconds(10))).state == 7)
        #expect(try await appSecond.next(deadline: .after(.seconds(10))).state == 7)
        #expect(try await otherObservation.next(deadline: .after(.seconds(10))).state == 7)
    }

    @Test("observing a name in a new bit wakes no thread of a process asleep on its doorbell (a poster in its bit: a role's acquirer between waits); the new observation gets the next post")
    func anObservationInANewBitWakesNoThreadAsleepOnItsDoorbell() async throws {
        let two = try await TwoAsleepOnTheGroupWord()
        let (app, other, appTable) = (two.app, two.other, two.appTable)
        // The app posts in its bit: it moves to its doorbell.
        try app.signals.post("role", state: 1)
        #expect(try await two.otherObservation.next(deadline: .after(.seconds(10))).state == 1)
        try await eventually("the poster on its doorbell") { appTable.entryForTesting?.sleeping == SignalTable.sleepsOnDoorbell }
        let rounds = try await Self.settledRounds(appTable)[0]
        // A name in a bit it does not watch yet (names are tried until one adds a bit).
        let interest = try #require(appTable.entryForTesting).interest
        var observation: SignalObservation?
        var name = ""
        for index in 0..<64 where observation == nil {
            name = "other-\(index)"
            let candidate = try app.signals.observe(name)
            if try #require(appTable.entryForTesting).interest != interest { observation = candidate }
        }
        let added = try #require(observation, "no name fell outside the watched bit")
        try await Task.sleep(for: .milliseconds(200))
        #expect(appTable.threadRounds == rounds, "the thread asleep on its doorbell went round for the registration")
        #expect(appTable.entryForTesting?.sleeping == SignalTable.sleepsOnDoorbell)
        // The other process's post of the new name rings that doorbell.
        try other.signals.post(name, state: 9)
        #expect(try await added.next(deadline: .after(.seconds(10))).state == 9)
    }

    @Test("every post after the observation started is followed by a delivery; posts coalesce")
    func deliveriesFollowPosts() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let signals = try container.signals
        try signals.post("early", state: 1)  // before observing: not owed
        let observation = try signals.observe("early")
        await #expect(throws: BatonError.self) { try await observation.next(deadline: .after(.milliseconds(100))) }
        for value in 2...50 { try signals.post("early", state: UInt64(value)) }
        let delivery = try await observation.next(deadline: .after(.seconds(10)))
        #expect(delivery.name == "early")
        // Coalesced or not, the last state is what a late reader sees.
        var last = delivery.state
        while let next = try? await observation.next(deadline: .after(.milliseconds(200))) { last = next.state }
        #expect(last == 50)
        #expect(try signals.state(of: "early") == 50)
    }

    @Test("a delivery counts the posts it stands for: this process's own later post does not hide another process's")
    func deliveriesCountTheirPosts() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let signals = try container.signals
        let observation = try signals.observe("counted")
        let observer = observation.observer
        // Another process posts; the delivery is left untaken, as when the observing task has
        // not run yet.
        let seen = observer.arrivalCounter.snapshot()
        #expect(try await runBaton(["signal", "post", "counted", "--state", "5"], container: directory.path).status == 0)
        try await observer.arrivalCounter.wait(after: seen, deadline: .after(.seconds(10)))
        // Then this process posts (delivered inline): the one delivery carries its state, and
        // stands for both posts.
        try signals.post("counted", state: 9)
        let both = try #require(try observer.takeCounted())
        #expect(both.delivery.state == 9 && both.posts == 2)
        // Its own post alone stands for one.
        try signals.post("counted", state: 10)
        let alone = try #require(try observer.takeCounted())
        #expect(alone.delivery.state == 10 && alone.posts == 1)
        #expect(try observer.takeCounted() == nil)
    }

    @Test("a post from another process wakes an in-process observer")
    func crossProcessPost() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let observation = try container.signals.observe("from-child")
        let result = try await runBaton(["signal", "post", "from-child", "--state", "77"], container: directory.path)
        #expect(result.status == 0)
        let delivery = try await observation.next(deadline: .after(.seconds(10)))
        #expect(delivery.state == 77)
    }

    @Test("a task preferring Signals.executor is resumed on the signal thread by another process's post")
    func executorRunsOnTheSignalThread() async throws {
        let directory = try TemporaryContainer()
        let signals = try SharedContainer(path: directory.path).signals
        let observation = try signals.observe("direct")
        let (state, threadName) = try await withTaskExecutorPreference(signals.executor) {
            let child = try ChildProcess(["signal", "post", "direct", "--state", "11"], container: directory.path)
            let delivery = try await observation.next(deadline: .after(.seconds(30)))
            _ = try await child.wait()
            // The name of the thread this code resumed on.
            let name = (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? ""
            return (delivery.state, name.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        #expect(state == 11)
        #expect(threadName == "baton-signals")
    }

    @Test("a task that keeps Signals.executor after its container is gone still runs, on the global executor")
    func executorOutlivesItsTable() async throws {
        let directory = try TemporaryContainer()
        weak var table: SignalTable?
        let executor: any TaskExecutor = try {
            let signals = try SharedContainer(path: directory.path).signals
            table = signals.backend as? SignalTable
            return signals.executor
        }()
        try await eventually("the signal table is gone") { table == nil }
        // The executor holds its queue, not the table: a job queued once the table is gone
        // must go elsewhere, not into a queue no thread runs.
        let finished = Mutex(false)
        Task {
            await withTaskExecutorPreference(executor) {
                await Task.yield()
                finished.withLock { $0 = true }
            }
        }
        // The job then waits for Swift's global pool: 60 s, as the suite's other waits for the
        // scheduler. In a fresh CI run's first seconds every test is starved (tests that take
        // under a second took 11-12 s beside this one, which then missed a 10 s bound). A job
        // left in a queue no thread runs never runs at all.
        try await eventually("the task on the executor of a gone table finished", within: 60) { finished.withLock { $0 } }
    }

    @Test("a delivery to a task on the signal thread costs that thread one round, not two")
    func deliveryOnTheSignalThreadTakesOneRound() async throws {
        let directory = try TemporaryContainer()
        let signals = try SharedContainer(path: directory.path).signals
        let table = try #require(signals.backend as? SignalTable)
        let observation = try signals.observe("one-round")
        let posts = 10
        // The observing task runs on the signal thread and only waits for deliveries; this task
        // posts (from other processes) and hears of each delivery through a stream, so nothing
        // else runs on the signal thread.
        let (delivered, continuation) = AsyncStream.makeStream(of: UInt64.self)
        let observer = Task {
            try await withTaskExecutorPreference(signals.executor) {
                for try await delivery in observation { continuation.yield(delivery.state) }
            }
        }
        defer { observer.cancel() }
        var arrivals = delivered.makeAsyncIterator()
        // The first post settles the thread (it started with the observation).
        #expect(try await runBaton(["signal", "post", "one-round", "--state", "1"], container: directory.path).status == 0)
        #expect(await arrivals.next() == 1)
        let before = table.threadRounds
        for state in 2...UInt64(posts + 1) {
            #expect(try await runBaton(["signal", "post", "one-round", "--state", "\(state)"], container: directory.path).status == 0)
            #expect(await arrivals.next() == state)
        }
        let rounds = table.threadRounds - before
        // One round per post: the delivery resumes the task, which runs in that round and waits
        // again. A task resumed by its own thread's delivery must not wake that thread once more
        // (a second round per delivery, with its look at the table).
        #expect(rounds <= UInt64(posts) + 2, "\(rounds) rounds for \(posts) posts")
    }

    @Test("entries of killed processes are reused, and observers beyond the 64 entries still get every post")
    func entriesAreReusedAndOverflowWorks() async throws {
        let directory = try TemporaryContainer()
        // Eight processes take entries, then die without cleaning up.
        let watchers = try (0..<8).map { _ in
            try ChildProcess(["signal", "watch", "crowd", "--count", "1", "--timeout", "60", "--announce"], container: directory.path)
        }
        for watcher in watchers { try await watcher.line(timeout: 60) { $0 == "ready" } }
        for watcher in watchers {
            watcher.signal(SIGKILL)
            _ = try await watcher.wait()
        }
        // 66 observers in this process, each through its own container object (its own table
        // mapping, so its own entry): 64 entries, the dead processes' ones included, and 2 on
        // the shared word.
        let containers = try (0..<66).map { _ in try SharedContainer(path: directory.path) }
        let observations = try containers.map { try $0.signals.observe("crowd") }
        let table = try Data(contentsOf: URL(fileURLWithPath: directory.path + "/.baton/signals"))
        let owners = (0..<64).map { index in
            table.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 1024 + index * 32, as: Int32.self) }
        }
        #expect(owners.allSatisfy { $0 == getpid() })
        let result = try await runBaton(["signal", "post", "crowd", "--state", "5"], container: directory.path)
        #expect(result.status == 0)
        for observation in observations {
            #expect(try await observation.next(deadline: .after(.seconds(30))).state == 5)
        }
        // A post from this process reaches its own observers too (delivered by the poster).
        try containers[0].signals.post("crowd", state: 6)
        for observation in observations {
            #expect(try await observation.next(deadline: .after(.seconds(30))).state == 6)
        }
    }

    @Test("a signal table truncated under a watcher: no crash, and posts after it reach the watcher")
    func truncatedTableUnderAWatcher() async throws {
        let directory = try TemporaryContainer()
        let watcher = try ChildProcess(["signal", "watch", "cut", "--count", "1", "--timeout", "60", "--announce"], container: directory.path)
        try await watcher.line(timeout: 60) { $0 == "ready" }
        #expect(truncate(directory.path + "/.baton/signals", 0) == 0)
        // Posts until the watcher gets one (the first may rebuild the table and move everyone).
        var delivered = false
        for attempt in 0..<20 where !delivered {
            let post = try await runBaton(["signal", "post", "cut", "--state", "\(attempt + 1)"], container: directory.path)
            #expect(post.status == 0, "post: \(post.status) \(post.errors)")
            delivered = (try? await watcher.line(timeout: 1) { $0.hasPrefix("cut") }) != nil
        }
        #expect(delivered, "the watcher got no post after the truncation")
        let status = try await watcher.wait(timeout: 30)
        #expect(status == 0, "watcher exit \(status): \(watcher.errorLines)")
    }

    /// A process that has the table mapped already (this one) posts once after another program
    /// cut the file short. Its post finds the cut through the mapping guard's count, with no
    /// `fstat` (the touch of the cut part is repaired, then counted), rebuilds the table and
    /// retires the cut one, which wakes the watcher: the one post reaches it. Cut at 0 (the
    /// header faults), at 100 bytes (the header stays, the process entries read as zeros, the
    /// slots fault) and at 6,000 bytes (the first slots stay).
    @Test("a table cut short under a poster that has it mapped: the poster's one post reaches a sleeping watcher", arguments: [0, 100, 6_000])
    func tableCutUnderAPosterThatHasItMapped(_ size: Int) async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        try container.signals.post("cut", state: 1) // mapped, and the slot named
        let watcher = try ChildProcess(["signal", "watch", "cut", "--count", "5", "--timeout", "60", "--announce"], container: directory.path)
        defer { watcher.signal(SIGKILL) }
        try await watcher.line(timeout: 60) { $0 == "ready" }
        #expect(truncate(directory.path + "/.baton/signals", off_t(size)) == 0)
        try container.signals.post("cut", state: 7)
        // The move to the new table is one delivery (its state may be the carried-over one, or
        // 0 for a slot that was cut), the post made again on the new table is another, or both
        // are one: a line with state 7 comes either way.
        _ = try await watcher.line(timeout: 30) { $0 == "cut state=7" }
        let size = try FileManager.default.attributesOfItem(atPath: directory.path + "/.baton/signals")[.size] as? Int
        #expect(size == 4096 + 256 * 4096, "the table in place has its full size: \(String(describing: size))")
    }

    @Test("a suspended process holds no lock on the signal table, and gets the posts made meanwhile after resume")
    func suspensionDropsTheEntryLock() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let observation = try container.signals.observe("while-suspended")
        // The process's entry is owned through its owner token, a file it keeps locked.
        #expect(!ProcLocks.held(by: getpid(), under: directory.path).isEmpty, "the owner token is locked while it observes")
        await container.suspend()
        #expect(ProcLocks.held(by: getpid(), under: directory.path).isEmpty, "no lock in the container while suspended")
        // Another process takes entries meanwhile (possibly this one's) and posts.
        let watcher = try ChildProcess(["signal", "watch", "other", "--count", "1", "--timeout", "60", "--announce"], container: directory.path)
        try await watcher.line(timeout: 60) { $0 == "ready" }
        #expect(try await runBaton(["signal", "post", "while-suspended", "--state", "9"], container: directory.path).status == 0)
        try await container.resume()
        // The entry is taken back (or another claimed) with a new token, which is locked.
        #expect(try await observation.next(deadline: .after(.seconds(30))).state == 9)
        #expect(!ProcLocks.held(by: getpid(), under: directory.path).isEmpty, "the new owner token is locked")
        // Posts after the resume arrive too.
        #expect(try await runBaton(["signal", "post", "while-suspended", "--state", "10"], container: directory.path).status == 0)
        #expect(try await observation.next(deadline: .after(.seconds(30))).state == 10)
        watcher.signal(SIGKILL)
    }

    @Test("a holder of the table lock that never lets go (stopped in a rebuild) makes a post say busy, not hang; a release lets it through at once")
    func tableLockHolderThatNeverLetsGo() async throws {
        let directory = try TemporaryContainer()
        #expect(try await runBaton(["signal", "post", "held", "--state", "1"], container: directory.path).status == 0)
        // Scribbled header: the next process to open the table must rebuild it, under the lock.
        let handle = try #require(FileHandle(forWritingAtPath: directory.path + "/.baton/signals"))
        handle.write(Data(repeating: 0xA5, count: 64))
        try handle.close()
        // This process holds the lock, as a holder stopped (SIGSTOP) inside a rebuild would.
        let lock = open(directory.path + "/.baton/signals.lock", O_RDWR | O_CREAT, 0o600)
        #expect(lock >= 0)
        #expect(flock(lock, LOCK_EX) == 0)
        let busy = try await runBaton(["signal", "post", "held", "--state", "2"], container: directory.path, timeout: 20)
        #expect(busy.status == 4, "post while the lock is held: \(busy.status) \(busy.errors)")
        #expect(busy.errors.joined().contains("lock of the signal table"), "\(busy.errors)")
        // Released while a post waits: the post goes through. The post's patience starts after
        // it was spawned, so a release less than `tableLockPatience` after the spawn comes before
        // it gives up: that post must succeed. On a loaded machine this process may come back
        // from its sleep too late; then the lock is taken again and the step is tried again.
        var lockHeld = lock
        var timelyReleases = 0
        for _ in 0..<5 where timelyReleases == 0 {
            let spawned = ContinuousClock.now
            let waiting = try ChildProcess(["signal", "post", "held", "--state", "3"], container: directory.path)
            try await Task.sleep(for: .milliseconds(300))
            close(lockHeld)
            let releasedAfter = ContinuousClock.now - spawned
            let status = try await waiting.wait(timeout: 20)
            if releasedAfter < SignalTable.tableLockPatience {
                timelyReleases += 1
                #expect(status == 0, "released \(releasedAfter) after the spawn: \(waiting.errorLines)")
            } else {
                lockHeld = open(directory.path + "/.baton/signals.lock", O_RDWR)
                #expect(lockHeld >= 0 && flock(lockHeld, LOCK_EX) == 0)
            }
        }
        #expect(timelyReleases == 1, "this process never released the lock within the post's patience")
        // It rebuilt the table.
        let header = try Data(contentsOf: URL(fileURLWithPath: directory.path + "/.baton/signals")).prefix(8)
        #expect(header == Data("BATNSIG1".utf8))
    }

    @Test("a corrupt signal table is rebuilt and observers keep working")
    func corruptTableIsRebuilt() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let signals = try container.signals
        try signals.post("survivor", state: 5)
        let watcher = try ChildProcess(["signal", "watch", "survivor", "--count", "1", "--timeout", "60", "--announce"], container: directory.path)
        try await watcher.line(timeout: 60) { $0 == "ready" }

        // Scribble over the header and the first slots.
        let path = directory.path + "/.baton/signals"
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.seek(toOffset: 0)
        handle.write(Data(repeating: 0xA5, count: 8192))
        try handle.close()

        // A fresh process sees the bad header, rebuilds, and its post still reaches the watcher
        // (which moves to the new table when the old one is retired).
        let result = try await runBaton(["signal", "post", "survivor", "--state", "9"], container: directory.path)
        #expect(result.status == 0)
        let line = try await watcher.line(timeout: 30) { $0.hasPrefix("survivor") }
        #expect(line.hasPrefix("survivor state="))
        #expect(try await watcher.wait() == 0)
        let header = try Data(contentsOf: URL(fileURLWithPath: path)).prefix(8)
        #expect(header == Data("BATNSIG1".utf8))
    }

    @Test("scribbled slots behind a valid header are detected by checksum and rebuilt")
    func corruptSlotsAreRebuilt() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        for index in 0..<64 { try container.signals.post("name-\(index)", state: UInt64(index)) }
        let path = directory.path + "/.baton/signals"
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.seek(toOffset: 4096)
        handle.write(Data(repeating: 0x5A, count: 1 << 20))
        try handle.close()
        // Another process finds the bad slots while looking up a name, rebuilds the table and
        // posts; every slot failed its checks, so no state is carried over.
        let result = try await runBaton(["signal", "post", "name-3", "--state", "33"], container: directory.path)
        #expect(result.status == 0)
        let fresh = try SharedContainer(path: directory.path)
        #expect(try fresh.signals.state(of: "name-3") == 33)
        #expect(try fresh.signals.state(of: "name-4") == 0)
    }

    @Test("a rebuild carries over every name whose slot passes its checks, with its state; a scribbled slot is dropped and reported")
    func rebuildCarriesSlotsOver() async throws {
        let directory = try TemporaryContainer()
        let writer = try SharedContainer(path: directory.path)
        for index in 0..<64 { try writer.signals.post("name-\(index)", state: UInt64(100 + index)) }
        let path = directory.path + "/.baton/signals"
        var table = try Data(contentsOf: URL(fileURLWithPath: path))
        // Find the slot of name-3 (slots are 256 bytes after a 4 KiB header, the name at 40) and
        // scribble its checksum; scribble the header's magic too, so that the next process to
        // open the table rebuilds it.
        let name = Data("name-3".utf8)
        let slot = try #require((0..<4096).first { slot in
            let base = 4096 + slot * 256
            return table[base + 40 ..< base + 40 + name.count] == name && table[base + 40 + name.count] == 0
        })
        table[4096 + slot * 256 + 36] ^= 0xFF
        table[0] ^= 0xFF
        try table.write(to: URL(fileURLWithPath: path))

        let (logger, store) = CapturingLogHandler.logger()
        let reader = try SharedContainer(path: directory.path, logger: logger)
        #expect(try reader.signals.state(of: "name-4") == 104)
        #expect(try reader.signals.state(of: "name-63") == 163)
        #expect(try reader.signals.state(of: "name-3") == 0)
        #expect(store.messages.contains { $0.contains("carried 63 names over; 1 slot failed the checks") }, "\(store.messages)")
        // The writer, still on the old table, moves to the rebuilt one with its states.
        #expect(try writer.signals.state(of: "name-5") == 105)
    }

    @Test("posts racing rebuilds by another process are never lost: each post is read back, and its observer's last delivery is it")
    func postsRacingRebuilds() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let signals = try container.signals
        let observation = try signals.observe("raced")
        try signals.post("raced", state: 0)
        let rebuilder = try ChildProcess(harness: ["kernel-test", "rebuild-signals", "--rounds", "4000"], container: directory.path)
        try await rebuilder.line(timeout: 60) { $0 == "ready" }
        var posted: UInt64 = 0
        var misreads: [String] = []
        var finished = false
        while !finished {
            posted += 1
            try signals.post("raced", state: posted)
            let read = try signals.state(of: "raced")
            if read != posted { misreads.append("posted \(posted), read \(read)") }
            if posted % 64 == 0 { finished = rebuilder.outputClosed }
        }
        #expect(try await rebuilder.wait() == 0)
        #expect(misreads.count == 0, "\(misreads.count) of \(posted) posts lost to a rebuild: \(misreads.prefix(5))")
        // The observer's pending delivery (coalesced) is the last state posted, not the state a
        // move to a rebuilt table found.
        var last: UInt64 = 0
        while let delivery = try? await observation.next(deadline: .after(.milliseconds(200))) { last = delivery.state }
        #expect(last == posted)
        print("posts racing 4000 rebuilds: \(posted) posts, \(misreads.count) lost")
    }

    @Test("bad signal names are refused with invalidName", arguments: ["", String(repeating: "x", count: 129), "nul\u{0}inside"])
    func badNames(name: String) throws {
        let directory = try TemporaryContainer()
        let signals = try SharedContainer(path: directory.path).signals
        #expect { try signals.post(name) } throws: { ($0 as? BatonError)?.code == .invalidName }
        #expect { _ = try signals.observe(name) } throws: { ($0 as? BatonError)?.code == .invalidName }
    }

    @Test("a 128-byte UTF-8 name is accepted")
    func longestName() throws {
        let directory = try TemporaryContainer()
        let signals = try SharedContainer(path: directory.path).signals
        let name = String(repeating: "é", count: 64)  // 128 bytes
        try signals.post(name, state: 3)
        #expect(try signals.state(of: name) == 3)
    }

    @Test("the command line reports a bad name and times out with status 3")
    func commandLineErrors() async throws {
        let directory = try TemporaryContainer()
        let bad = try await runBaton(["signal", "post", String(repeating: "y", count: 200)], container: directory.path)
        #expect(bad.status != 0)
        let timeout = try await runBaton(["signal", "watch", "quiet", "--timeout", "0.3"], container: directory.path)
        #expect(timeout.status == 3)
    }
}
