import Baton
import Foundation
import BatonTestSupport
import Testing

@Suite("Shared defaults", .serialized)
struct DefaultsTests {
    struct Profile: Codable, Equatable {
        var name: String
        var tags: [String]
    }

    struct TestFence: Fence {
        var scope: String
        var epoch: UInt64
        func validate() throws {}
    }

    @Test func everyTypeRoundTrips() throws {
        let directory = try TemporaryContainer()
        let defaults = try SharedDefaults(SharedContainer(path: directory.path), suite: "types")
        let date = Date(timeIntervalSinceReferenceDate: 123_456.5)
        try defaults.set(true, forKey: "bool")
        try defaults.set(-42, forKey: "int")
        try defaults.set(2.5, forKey: "double")
        try defaults.set("héllo", forKey: "string")
        try defaults.set(Data([0, 1, 2, 255]), forKey: "data")
        try defaults.set(date, forKey: "date")
        try defaults.set(Profile(name: "a", tags: ["x", "y"]), forKey: "profile")
        #expect(defaults.bool(forKey: "bool") == true)
        #expect(defaults.integer(forKey: "int") == -42)
        #expect(defaults.double(forKey: "double") == 2.5)
        #expect(defaults.double(forKey: "int") == -42)
        #expect(defaults.string(forKey: "string") == "héllo")
        #expect(defaults.data(forKey: "data") == Data([0, 1, 2, 255]))
        #expect(defaults.date(forKey: "date") == date)
        #expect(try defaults.value(Profile.self, forKey: "profile") == Profile(name: "a", tags: ["x", "y"]))
        #expect(defaults["profile", as: Profile.self]?.tags == ["x", "y"])
        #expect(defaults["int", as: Int.self] == -42)
        let typed = DefaultsKey<Profile>("profile")
        #expect(defaults[typed]?.name == "a")
        #expect(defaults.string(forKey: "int") == nil)
        #expect(defaults.string(forKey: "absent") == nil)
        #expect(Swift.Set(try defaults.keys()) == ["bool", "int", "double", "string", "data", "date", "profile"])
        #expect(throws: BatonError.self) { try defaults.value(Profile.self, forKey: "int") }
        do {
            _ = try defaults.value(Profile.self, forKey: "int")
        } catch let error as BatonError {
            #expect(error.code == .typeMismatch)
        }
        try defaults.removeValue(forKey: "int")
        #expect(defaults.integer(forKey: "int") == nil)
        #expect(try defaults.update("int", as: Int.self) { ($0 ?? 0) + 5 } == 5)
        #expect(try defaults.compareAndSet("int", expected: 4, new: 9) == false)
        #expect(try defaults.compareAndSet("int", expected: 5, new: 9) == true)
        #expect(try defaults.compareAndSet("int", expected: 9, new: nil as Int?) == true)
        #expect(defaults.integer(forKey: "int") == nil)

        // Another instance (its own mapping and index, like another process) sees everything.
        let other = try SharedDefaults(SharedContainer(path: directory.path), suite: "types")
        #expect(other.string(forKey: "string") == "héllo")
        #expect(other.date(forKey: "date") == date)
        #expect(other.recoveryReport.isClean)
    }

    @Test func limitsAndBadInputGiveDocumentedErrors() async throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let defaults = try SharedDefaults(container)
        func code(_ body: () throws -> Void) -> BatonError.Code? {
            do { try body() } catch let error as BatonError { return error.code } catch { return nil }
            return nil
        }
        #expect(code { try defaults.set(1, forKey: "") } == .invalidName)
        #expect(code { try defaults.set(1, forKey: String(repeating: "k", count: 1025)) } == .tooLarge)
        #expect(code { try defaults.set(1, forKey: String(repeating: "k", count: 1024)) } == nil)
        #expect(code { try defaults.set(Data(count: SharedDefaults.maxValueBytes + 1), forKey: "big") } == .tooLarge)
        #expect(code { try defaults.set(Data(count: SharedDefaults.maxValueBytes), forKey: "big") } == nil)
        #expect(defaults.data(forKey: "big")?.count == SharedDefaults.maxValueBytes)
        #expect(code { _ = try SharedDefaults(container, suite: "a/b") } == .invalidName)
        #expect(code { _ = try SharedDefaults(container, suite: "..") } == .invalidName)
        #expect(code { _ = try SharedDefaults(container, suite: "") } == .invalidName)

        let absent = try await runBaton(["defaults", "get", "nothing"], container: directory.path)
        #expect(absent.status == 1)
        let badInt = try await runBaton(["defaults", "set", "n", "abc", "--type", "int"], container: directory.path)
        #expect(badInt.status != 0)
        let badJSON = try await runBaton(["defaults", "set", "n", "{oops", "--type", "json"], container: directory.path)
        #expect(badJSON.status != 0)
        let badSuite = try await runBaton(["defaults", "get", "k", "--suite", "x/y"], container: directory.path)
        #expect(badSuite.status != 0)
    }

    @Test func commandLineSetGetListRemove() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        #expect(try await runBaton(["defaults", "set", "s", "hello world"], container: path).status == 0)
        #expect(try await runBaton(["defaults", "set", "n", "12", "--type", "int"], container: path).status == 0)
        #expect(try await runBaton(["defaults", "set", "j", "{\"b\":[1,2],\"a\":true}", "--type", "json"], container: path).status == 0)
        #expect(try await runBaton(["defaults", "get", "s"], container: path).lines == ["hello world"])
        #expect(try await runBaton(["defaults", "get", "n"], container: path).lines == ["12"])
        let list = try await runBaton(["defaults", "list", "--json"], container: path)
        #expect(list.status == 0)
        let object = try JSONSerialization.jsonObject(with: Data(list.lines.joined().utf8)) as? [String: Any]
        #expect(object?["s"] as? String == "hello world")
        #expect(object?["n"] as? Int == 12)
        #expect((object?["j"] as? [String: Any])?["a"] as? Bool == true)
        #expect(try await runBaton(["defaults", "remove", "s"], container: path).status == 0)
        #expect(try await runBaton(["defaults", "get", "s"], container: path).status == 1)
        // The library sees what the command line wrote.
        let defaults = try SharedDefaults(SharedContainer(path: path))
        #expect(defaults.integer(forKey: "n") == 12)
    }

    @Test func twoWritersAndAReaderInThreeProcessesStayConsistent() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        let keys = 40
        let writerA = try ChildProcess(harness: ["defaults", "test-writer", "--name", "A", "--keys", "\(keys)", "--seconds", "8"], container: path)
        let writerB = try ChildProcess(harness: ["defaults", "test-writer", "--name", "B", "--keys", "\(keys)", "--seconds", "8"], container: path)
        let reader = try ChildProcess(harness: ["defaults", "test-reader", "--keys", "\(keys)", "--seconds", "9"], container: path)
        let doneA = try await writerA.line(timeout: 60) { $0.hasPrefix("done") }
        let doneB = try await writerB.line(timeout: 60) { $0.hasPrefix("done") }
        let verdict = try await reader.line(timeout: 60) { $0.hasPrefix("ok") || $0.hasPrefix("bad") }
        #expect(verdict.hasPrefix("ok"), "reader: \(verdict)")
        #expect(try await writerA.wait() == 0)
        #expect(try await writerB.wait() == 0)
        #expect(try await reader.wait() == 0)
        #expect(Int(doneA.split(separator: " ")[1])! > keys)
        #expect(Int(doneB.split(separator: " ")[1])! > keys)

        func lasts(_ child: ChildProcess) -> [String: Int] {
            var result: [String: Int] = [:]
            for line in child.lines where line.hasPrefix("last ") {
                let parts = line.split(separator: " ")
                result[String(parts[1])] = Int(parts[2])!
            }
            return result
        }
        let lastA = lasts(writerA), lastB = lasts(writerB)
        #expect(lastA.count == keys && lastB.count == keys)
        let defaults = try SharedDefaults(SharedContainer(path: path))
        for index in 0..<keys {
            let key = "k\(index)"
            let value = try #require(defaults.string(forKey: key))
            let expected = [
                "A:\(lastA[key]!):" + String(value.split(separator: ":", maxSplits: 2).last ?? ""),
                "B:\(lastB[key]!):" + String(value.split(separator: ":", maxSplits: 2).last ?? ""),
            ]
            // The final value is the last write of one of the writers, whole.
            #expect(expected.contains(value), "\(key) = \(value.prefix(24))...")
            #expect(value.hasPrefix("A:\(lastA[key]!):") || value.hasPrefix("B:\(lastB[key]!):"))
        }
        #expect(try defaults.verify().isClean)
    }

    @Test func compareAndSetFromEightProcessesCountsExactly() async throws {
        let directory = try TemporaryContainer()
        let children = try (0..<8).map { _ in
            try ChildProcess(harness: ["defaults", "test-increment", "--key", "counter", "--count", "1000", "--wait-for-go"], container: directory.path)
        }
        for child in children { try await child.line(timeout: 30) { $0 == "ready" } }
        let defaults = try SharedDefaults(SharedContainer(path: directory.path))
        try defaults.set(true, forKey: "go") // all eight start at once, and their CAS loops overlap
        for child in children {
            #expect(try await child.wait(timeout: 120) == 0)
        }
        #expect(defaults.integer(forKey: "counter") == 8_000)
    }

    @Test func killDuringLargeWritesNeverLeavesATornValue() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        var lastWritten = 0
        for round in 0..<8 {
            let writer = try ChildProcess(harness: ["defaults", "test-big-writer", "--size", "\(2 << 20)"], container: path)
            _ = try await writer.line(timeout: 30) { $0.hasPrefix("wrote") }
            try await Task.sleep(for: .milliseconds(Int.random(in: 1...40)))
            // Stopped, perhaps in the middle of an append with the writer lock held: readers in
            // other processes take no lock, so they still read the last committed value.
            writer.signal(SIGSTOP)
            let whileStopped = try await runHarness(["defaults", "test-check-big"], container: path)
            #expect(whileStopped.lines.contains { $0.hasPrefix("ok ") }, "round \(round): \(whileStopped.lines)")
            writer.signal(SIGKILL)
            _ = try await writer.wait()
            lastWritten = max(lastWritten, writer.lines.compactMap { $0.hasPrefix("wrote ") ? Int($0.dropFirst(6)) : nil }.max() ?? 0)
            let check = try await runHarness(["defaults", "test-check-big"], container: path)
            #expect(check.status == 0, "round \(round): \(check.lines)")
            #expect(check.lines.contains { $0.hasPrefix("ok ") }, "round \(round): \(check.lines)")
        }
        let defaults = try SharedDefaults(SharedContainer(path: path))
        // Every crash repair dropped only an interrupted write, never committed data.
        #expect(!defaults.recoveryReport.lostData)
        try defaults.set("after", forKey: "probe")
        #expect(!(try defaults.verify().lostData))
    }

    @Test func aWriterKilledHoldingTheLockIsRepairedByTheNext() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        #expect(try await runBaton(["defaults", "set", "before", "1"], container: path).status == 0)
        let dead = try await runHarness(["defaults", "test-die-mid-write"], container: path)
        #expect(dead.lines == ["holding"])
        #expect(dead.status == 128 + SIGKILL)
        // Readers take no lock and see the committed state.
        #expect(try await runBaton(["defaults", "get", "before"], container: path).lines == ["1"])
        // The next writer finds the robust mutex's owner dead, drops the torn tail, and writes.
        let defaults = try SharedDefaults(SharedContainer(path: path))
        try defaults.set("2", forKey: "after")
        #expect(defaults.recoveryReport.crashRepairs == 1)
        #expect(defaults.recoveryReport.droppedTailBytes > 0)
        #expect(!defaults.recoveryReport.lostData)
        #expect(defaults.string(forKey: "before") == "1")
        #expect(defaults.string(forKey: "after") == "2")
        let verify = try await runBaton(["defaults", "verify"], container: path)
        #expect(verify.status == 0, "\(verify.lines)")
        #expect(try await runBaton(["defaults", "get", "after"], container: path).lines == ["2"])
    }

    @Test func aFlippedByteIsDetectedAndTheOtherValuesKept() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        for index in 1...5 {
            #expect(try await runBaton(["defaults", "set", "key\(index)", "value-number-\(index)"], container: path).status == 0)
        }
        let logPath = path + "/.baton/defaults/standard.log"
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: logPath)))
        let needle = Array("value-number-3".utf8)
        let position = try #require((0..<(bytes.count - needle.count)).first { Array(bytes[$0..<($0 + needle.count)]) == needle })
        bytes[position + 4] ^= 0x20
        try Data(bytes).write(to: URL(fileURLWithPath: logPath))

        let verify = try await runBaton(["defaults", "verify"], container: path)
        #expect(verify.status == 6)
        #expect(verify.lines.first?.contains("\"lost_data\":true") == true)
        let defaults = try SharedDefaults(SharedContainer(path: path))
        for index in [1, 2, 4, 5] {
            #expect(defaults.string(forKey: "key\(index)") == "value-number-\(index)")
        }
        #expect(defaults.string(forKey: "key3") == nil)
        // A write drops the damaged record from the file (keeping its bytes in quarantine); the
        // loss stays reported to every process until acknowledged.
        try defaults.set("after", forKey: "probe")
        let again = try await runBaton(["defaults", "verify"], container: path)
        #expect(again.status == 6)
        #expect(try await runBaton(["defaults", "acknowledge"], container: path).status == 0)
        let acknowledged = try await runBaton(["defaults", "verify"], container: path)
        #expect(acknowledged.status == 0)
    }

    @Test func aDamagedHeaderIsRewrittenAndTheRecordsKept() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        #expect(try await runBaton(["defaults", "set", "kept", "yes"], container: path).status == 0)
        let handle = try FileHandle(forUpdating: URL(fileURLWithPath: path + "/.baton/defaults/standard.log"))
        try handle.seek(toOffset: 20)
        try handle.write(contentsOf: Data([0xFF]))
        try handle.close()
        let defaults = try SharedDefaults(SharedContainer(path: path))
        #expect(defaults.recoveryReport.headerRepaired)
        #expect(!defaults.recoveryReport.lostData)
        #expect(defaults.string(forKey: "kept") == "yes")
        #expect(try await runBaton(["defaults", "get", "kept"], container: path).lines == ["yes"])
    }

    @Test func aWatcherInAnotherProcessSeesEachChange() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        let defaults = try SharedDefaults(SharedContainer(path: path))
        let watcher = try ChildProcess(["defaults", "watch", "color", "--count", "5", "--announce", "--timeout", "60"], container: path)
        try await watcher.line(timeout: 30) { $0 == "ready" }
        for index in 1...4 {
            try defaults.set("c\(index)", forKey: "color")
            try defaults.set(index, forKey: "other")
            try await watcher.line(timeout: 30) { $0 == "color=c\(index)" }
        }
        try defaults.removeValue(forKey: "color")
        try await watcher.line(timeout: 30) { $0 == "color removed" }
        #expect(try await watcher.wait() == 0)
    }

    @Test func changesInThisProcessSeeAnotherProcessWrites() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        let defaults = try SharedDefaults(SharedContainer(path: path))
        let changes = try defaults.changes()
        #expect(try await runBaton(["defaults", "set", "a", "1"], container: path).status == 0)
        #expect(try await changes.next(deadline: .seconds(30)) == "a")
        #expect(try await runBaton(["defaults", "set", "b", "2"], container: path).status == 0)
        #expect(try await changes.next(deadline: .seconds(30)) == "b")
        // The same value again is not a change; a new one is.
        #expect(try await runBaton(["defaults", "set", "a", "1"], container: path).status == 0)
        #expect(try await runBaton(["defaults", "set", "a", "3"], container: path).status == 0)
        #expect(try await changes.next(deadline: .seconds(30)) == "a")
        #expect(defaults.string(forKey: "a") == "3")
        await #expect(throws: BatonError.self) { _ = try await changes.next(deadline: .after(.milliseconds(100))) }
    }

    @Test func transactionsAreAllOrNothing() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        let first = try SharedDefaults(SharedContainer(path: path), suite: "bank")
        try first.transaction { transaction in
            try transaction.set(1_000, forKey: "x")
            try transaction.set(0, forKey: "y")
        }
        // Four independent stores (own mapping and index each) move money concurrently.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<4 {
                group.addTask {
                    let defaults = try SharedDefaults(SharedContainer(path: path), suite: "bank")
                    for _ in 0..<200 {
                        try defaults.transaction { transaction in
                            let x = try transaction.value(Int.self, forKey: "x") ?? 0
                            let y = try transaction.value(Int.self, forKey: "y") ?? 0
                            try transaction.set(x - 1, forKey: "x")
                            try transaction.set(y + 1, forKey: "y")
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(first.integer(forKey: "x") == 200)
        #expect(first.integer(forKey: "y") == 800)
        struct Refused: Error {}
        #expect(throws: Refused.self) {
            try first.transaction { transaction in
                try transaction.set(5, forKey: "x")
                throw Refused()
            }
        }
        #expect(first.integer(forKey: "x") == 200)
    }

    @Test func staleFencesAreRefused() throws {
        let directory = try TemporaryContainer()
        let defaults = try SharedDefaults(SharedContainer(path: directory.path))
        try defaults.set("one", forKey: "state", fencedBy: TestFence(scope: "leader", epoch: 2))
        do {
            try defaults.set("stale", forKey: "state", fencedBy: TestFence(scope: "leader", epoch: 1))
            Issue.record("a stale fence was accepted")
        } catch let error as BatonError {
            #expect(error.code == .fenced)
        }
        try defaults.set("three", forKey: "state", fencedBy: TestFence(scope: "leader", epoch: 3))
        #expect(defaults.string(forKey: "state") == "three")
        #expect(try defaults.fenceEpoch(scope: "leader") == 3)
    }

    @Test func compactionKeepsEveryValueAndOtherReadersFollow() throws {
        let directory = try TemporaryContainer()
        let container = try SharedContainer(path: directory.path)
        let writer = try SharedDefaults(container, suite: "churn")
        let reader = try SharedDefaults(SharedContainer(path: directory.path), suite: "churn")
        let payload = String(repeating: "v", count: 500)
        try writer.set(7, forKey: "fenced-check")
        // 100 rounds of 200 keys of ~530 bytes: about 11 MB appended, past the 8 MiB at which a
        // half-dead log is compacted.
        for round in 0..<100 {
            for index in 0..<200 { try writer.set("\(round):\(index):\(payload)", forKey: "key\(index)") }
            #expect(reader.string(forKey: "key\(round % 200)") == "\(round):\(round % 200):\(payload)")
        }
        let size = try FileManager.default.attributesOfItem(atPath: directory.path + "/.baton/defaults/churn.log")[.size] as! Int
        #expect(size <= 8 << 20, "the log was compacted (\(size) bytes after 20,000 writes of 530 bytes)")
        for index in 0..<200 { #expect(reader.string(forKey: "key\(index)") == "99:\(index):\(payload)") }
        #expect(reader.integer(forKey: "fenced-check") == 7)
        #expect(try reader.verify().isClean)
    }

    @Test func aFullDiskThrowsAndKeepsTheOldValue() async throws {
        let directory = try TemporaryContainer()
        let path = directory.path
        #expect(try await runBaton(["defaults", "set", "big", "old"], container: path).status == 0)
        let fill = try await runHarness(["defaults", "test-fill", "--limit", "300000", "--size", "\(1 << 20)"], container: path)
        #expect(fill.lines.contains("error noSpace"), "\(fill.lines)")
        #expect(try await runBaton(["defaults", "get", "big"], container: path).lines == ["old"])
    }

    /// The page a set's record lands in was faulted in before that set (by an earlier write,
    /// after its ring): the first write to a page of the shared log is a page fault of 20-40 us,
    /// which sat between a set and its watchers' wake-up. Counted with this thread's minor
    /// faults (`getrusage(RUSAGE_THREAD)`, Linux) around each set whose record starts a new page
    /// of the log; the log's end is read with `pread`, which faults nothing in this process.
    @Test func aSetIntoANewPageOfTheLogFindsItFaultedIn() throws {
        #if os(Linux)
        let directory = try TemporaryContainer()
        let defaults = try SharedDefaults(SharedContainer(path: directory.path), suite: "ahead")
        let fd = open(directory.path + "/.baton/defaults/ahead.log", O_RDONLY)
        try #require(fd >= 0)
        defer { close(fd) }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        var window = [UInt8](repeating: 0, count: 2 * page)
        /// The offset just past the last non-zero byte at or after `from` (which is in the log).
        func end(from: Int) -> Int {
            var start = from / page * page
            while true {
                let count = window.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, off_t(start)) }
                guard count > 0 else { return start }
                guard let last = window[..<count].lastIndex(where: { $0 != 0 }) else { return start }
                if last < count - 1 || count < window.count { return start + last + 1 }
                start += page
            }
        }
        func minorFaults() -> Int {
            var usage = rusage()
            getrusage(__rusage_who_t(1), &usage) // RUSAGE_THREAD (<sys/resource.h>, with _GNU_SOURCE)
            return usage.ru_minflt
        }
        try defaults.set(0, forKey: "k")
        var logEnd = end(from: 0)
        var crossings = 0, faulted = 0, round = 0
        while crossings < 16 {
            round += 1
            let before = minorFaults()
            try defaults.set(round, forKey: "k")
            let faults = minorFaults() - before
            let newEnd = end(from: logEnd)
            if (newEnd - 1) / page != (logEnd - 1) / page {
                crossings += 1
                if faults > 0 { faulted += 1 }
            }
            logEnd = newEnd
        }
        // Without the prefault every one of them faults; a stray fault (the heap growing) is
        // allowed once or twice.
        #expect(faulted <= 2, "\(faulted) of 16 sets whose record started a new page of the log took a page fault")
        #endif
    }
}
