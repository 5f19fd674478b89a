import Baton
import BatonCommandSupport
import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// `baton bench roles`: preemption, crash takeover and uncontended acquire+release, beside the
/// raw primitives measured in the same run: a `flock` handoff between two processes, a signal
/// post-to-wake, and the time a raw blocked `flock` waiter needs to notice the SIGKILL of a
/// holder process (the very same kind of Baton holder process that the takeover kills).
enum RolesBench: BenchSuite {
    static let name = "roles"
    static let shmName = "bench-roles.shm"
    // Layout of the shared bench page.
    static let goOffset = 0, doneOffset = 64, startOffset = 128, stampOffset = 192, seenOffset = 256, releasedOffset = 320

    static func run(container path: String, quick: Bool) async throws -> (results: [BenchResult], notes: [String: String]) {
        let container = try SharedContainer(path: path)
        let shm = try MappedFile(container, relativePath: shmName, minimumSize: 4096)
        let handoffRounds = quick ? 100 : 1_000
        let preemptRounds = quick ? 50 : 400
        let crashRounds = quick ? 10 : 60
        let uncontendedRounds = quick ? 500 : 5_000

        let handoff = try flockHandoff(path: path, shm: shm, rounds: handoffRounds)
        let signal = try signalAfterIdle(container: container, path: path, shm: shm, rounds: quick ? 100 : 1_000)
        let (preemption, breakdown) = try await Self.preemption(container: container, path: path, shm: shm, rounds: preemptRounds, onSignalThread: true)
        let (pooled, pooledBreakdown) = try await Self.preemption(container: container, path: path, shm: shm, rounds: preemptRounds, onSignalThread: false)
        var crashFloor: [Double] = [], takeover: [Double] = []
        for _ in 0..<crashRounds {
            // Interleaved so both see the same machine load.
            crashFloor.append(try rawCrashNotice(container: container, path: path, shm: shm))
            takeover.append(try await crashTakeover(container: container, path: path))
        }
        let (uncontended, rawLock) = try await uncontended(container: container, rounds: uncontendedRounds)

        let handoffP50 = percentile(handoff, 50), signalP50 = percentile(signal, 50)
        let results = [
            BenchResult(name: "preemption_p50_us", value: percentile(preemption, 50), unit: "us",
                        floorName: "flock_handoff_plus_signal_p50_us", floor: handoffP50 + signalP50),
            BenchResult(name: "preemption_p99_us", value: percentile(preemption, 99), unit: "us",
                        floorName: "flock_handoff_plus_signal_p99_us", floor: percentile(handoff, 99) + percentile(signal, 99)),
            BenchResult(name: "preemption_default_executor_p50_us", value: percentile(pooled, 50), unit: "us",
                        floorName: "flock_handoff_plus_signal_p50_us", floor: handoffP50 + signalP50),
            BenchResult(name: "crash_takeover_p50_us", value: percentile(takeover, 50), unit: "us",
                        floorName: "raw_flock_crash_notice_p50_us", floor: percentile(crashFloor, 50)),
            BenchResult(name: "crash_takeover_p99_us", value: percentile(takeover, 99), unit: "us",
                        floorName: "raw_flock_crash_notice_p99_us", floor: percentile(crashFloor, 99)),
            BenchResult(name: "uncontended_acquire_release_p50_us", value: percentile(uncontended, 50), unit: "us",
                        floorName: "raw_open_flock_close_p50_us", floor: percentile(rawLock, 50)),
            BenchResult(name: "flock_handoff_p50_us", value: handoffP50, unit: "us",
                        floorName: "signal_post_to_wake_p50_us", floor: signalP50),
        ]
        return (results, [
            "method": "preemption: main calls acquire while an executor process holds the role and releases on its first stop request; both sides run their role code on Baton's signal thread (withTaskExecutorPreference(container.signals.executor), the documented low-latency setup: a delivery resumes the task on the thread that saw it); preemption_default_executor: the same with both tasks on Swift's global executor (each wake-up then also hops to a pool thread); time until main holds it (the executor asks again only after main released) (\(preemptRounds) rounds). crash takeover: this process waits in acquire while a holder process is SIGKILLed; time from kill() to the grant (\(crashRounds) rounds, a fresh holder each). The raw crash floor kills the same kind of holder process while a raw process blocked in flock(2) on the holder's lock file waits. flock handoff: unlock to the blocked waiter's return (\(handoffRounds) rounds). signal: post-to-wake one way, 0.5 ms idle before each post like the preemption rounds.",
            "targets": "preemption p50 <= 3 x (flock handoff + signal) p50; crash takeover p50 <= 1.5 x raw crash floor p50",
            "cores": "\(sysconf(Int32(_SC_NPROCESSORS_ONLN)))",
            "preemption_breakdown": breakdown,
            "preemption_default_executor_breakdown": pooledBreakdown,
        ])
    }

    static func word(_ shm: MappedFile, _ offset: Int) -> UnsafeMutablePointer<UInt32> {
        shm.pointer.advanced(by: offset).assumingMemoryBound(to: UInt32.self)
    }

    static func stamp(_ shm: MappedFile, _ offset: Int) -> UnsafeMutablePointer<UInt64> {
        shm.pointer.advanced(by: offset).assumingMemoryBound(to: UInt64.self)
    }

    // MARK: Floors

    /// Unlock-to-acquire of a process blocked in flock(2).
    private static func flockHandoff(path: String, shm: MappedFile, rounds: Int) throws -> [Double] {
        let file = path + "/.baton/bench-handoff.lock"
        let fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        defer { close(fd) }
        baton_store32(word(shm, goOffset), 0)
        baton_store32(word(shm, doneOffset), 0)
        let worker = try WorkerProcess(suite: name, container: path, arguments: ["flock-handoff", file])
        try worker.waitReady()
        var samples: [Double] = []
        for round in 1...(rounds + rounds / 10) {
            flock(fd, LOCK_EX)
            baton_store32(word(shm, goOffset), UInt32(truncatingIfNeeded: round))
            AddressWait.wakeAll(word(shm, goOffset))
            usleep(300) // the worker blocks in flock meanwhile
            baton_store64(stamp(shm, startOffset), monotonicNanoseconds())
            flock(fd, LOCK_UN)
            SignalsBench.waitUntil(word(shm, doneOffset), equals: UInt32(truncatingIfNeeded: round))
            if round > rounds / 10 {
                samples.append(Double(baton_load64(stamp(shm, stampOffset)) &- baton_load64(stamp(shm, startOffset))) / 1_000)
            }
        }
        return samples
    }

    /// Signal post-to-wake, one way, with the same idle gap before each post as the preemption
    /// rounds have (a tight ping-pong keeps the CPUs awake and would flatter the floor).
    private static func signalAfterIdle(container: SharedContainer, path: String, shm: MappedFile, rounds: Int) throws -> [Double] {
        let signals = try container.signals
        baton_store32(word(shm, doneOffset), 0)
        let worker = try WorkerProcess(suite: name, container: path, arguments: ["signal-stamp"])
        try worker.waitReady()
        var samples: [Double] = []
        for round in 1...(rounds + rounds / 10) {
            usleep(500)
            let start = monotonicNanoseconds()
            try signals.post("bench.roles.ping", state: UInt64(round))
            SignalsBench.waitUntil(word(shm, doneOffset), equals: UInt32(truncatingIfNeeded: round))
            if round > rounds / 10 {
                samples.append(Double(baton_load64(stamp(shm, stampOffset)) &- start) / 1_000)
            }
        }
        return samples
    }

    /// From kill() of a Baton holder process to the return of a raw process blocked in flock(2)
    /// on that holder's lock file.
    private static func rawCrashNotice(container: SharedContainer, path: String, shm: MappedFile) throws -> Double {
        let holder = try WorkerProcess(suite: name, container: path, arguments: ["holder"])
        guard let line = holder.receiveLine(), line.hasPrefix("ready ") else {
            throw BatonError(.invalidArgument, "the holder worker did not start")
        }
        let directory = path + "/.baton/roles/bench"
        guard let file = try FileManager.default.contentsOfDirectory(atPath: directory)
            .first(where: { $0.hasPrefix("holder-\(holder.pid)-") }) else {
            throw BatonError(.notFound, "the holder worker's lock file is missing")
        }
        baton_store32(word(shm, doneOffset), 0)
        let waiter = try WorkerProcess(suite: name, container: path, arguments: ["flock-waiter", directory + "/" + file])
        try waiter.waitReady()
        usleep(5_000) // the waiter blocks in flock meanwhile
        let start = monotonicNanoseconds()
        holder.kill(SIGKILL)
        SignalsBench.waitUntil(word(shm, doneOffset), equals: 1)
        let notice = Double(baton_load64(stamp(shm, stampOffset)) &- start) / 1_000
        holder.wait()
        // The raw waiter now holds the stale holder file: end it before Baton's next round.
        waiter.kill(SIGKILL)
        waiter.wait()
        let role = try container.role("bench")
        _ = try role.status()
        return notice
    }

    /// From kill() of a holder process to the grant in this process, waiting in acquire.
    private static func crashTakeover(container: SharedContainer, path: String) async throws -> Double {
        let role = try container.role("bench")
        let holder = try WorkerProcess(suite: name, container: path, arguments: ["holder"])
        guard let line = holder.receiveLine(), line.hasPrefix("ready ") else {
            throw BatonError(.invalidArgument, "the holder worker did not start")
        }
        let waiting = Task { try await role.acquire(priority: .executor, kind: "bench", deadline: .after(.seconds(30))) }
        // Wait until this process is registered as a waiter and asleep.
        while try role.status().waiters.isEmpty { try await Task.sleep(for: .milliseconds(1)) }
        try await Task.sleep(for: .milliseconds(5))
        let start = monotonicNanoseconds()
        holder.kill(SIGKILL)
        let lease = try await waiting.value
        let elapsed = Double(monotonicNanoseconds() - start) / 1_000
        holder.wait()
        await lease.release()
        return elapsed
    }

    // MARK: Baton

    private static func preemption(container: SharedContainer, path: String, shm: MappedFile, rounds: Int, onSignalThread: Bool) async throws -> ([Double], String) {
        let role = try container.role("preempt")
        let worker = try WorkerProcess(suite: name, container: path, arguments: ["executor", onSignalThread ? "signal-thread" : "pool"])
        let executor: (any TaskExecutor)? = onSignalThread ? try container.signals.executor : nil
        var samples: [Double] = [], seen: [Double] = [], released: [Double] = []
        /// The start and end of the last measured round, kept until the executor has written
        /// that round's stamps: it stamps its release after `release()` returns, which may be
        /// after main already holds the role, so they are read only once it holds again (it
        /// asks again after its stamps).
        var unstamped: (start: UInt64, end: UInt64)?
        func heldAgain() throws {
            guard worker.receiveLine()?.hasPrefix("held") == true else {
                throw BatonError(.invalidArgument, "the executor worker stopped")
            }
            guard let (start, end) = unstamped else { return }
            unstamped = nil
            samples.append(Double(end - start) / 1_000)
            seen.append(Double(Int64(bitPattern: baton_load64(stamp(shm, seenOffset)) &- start)) / 1_000)
            released.append(Double(Int64(bitPattern: baton_load64(stamp(shm, releasedOffset)) &- start)) / 1_000)
        }
        for round in 0..<(rounds + rounds / 10) {
            try heldAgain()
            let (start, end) = try await withTaskExecutorPreference(executor) {
                try await Task.sleep(for: .microseconds(500))
                handOverTrace("roles.start")
                let start = monotonicNanoseconds()
                let lease = try await role.acquire(priority: .main, kind: "bench", deadline: .after(.seconds(10)))
                let end = monotonicNanoseconds()
                handOverTrace("roles.held")
                await lease.release()
                return (start, end)
            }
            worker.send("again")
            if round >= rounds / 10 { unstamped = (start, end) }
        }
        try heldAgain()
        // The slowest rounds (at or above p99), each as its three steps: where a tail comes from.
        let tail = percentile(samples, 99)
        let slowest = samples.indices.filter { samples[$0] >= tail }.map { index in
            "\(fixed(seen[index]))/\(fixed(released[index] - seen[index]))/\(fixed(samples[index] - released[index]))"
        }
        let shortestRelease = zip(seen, released).map { $1 - $0 }.min() ?? 0
        let breakdown = "p50 from main's acquire call: the executor sees the stop request at \(fixed(percentile(seen, 50))) us, has released at \(fixed(percentile(released, 50))) us, main holds at \(fixed(percentile(samples, 50))) us; the shortest release from seen to released: \(fixed(shortestRelease)) us; the rounds at or above p99, as request-to-seen/seen-to-released/released-to-held us: \(slowest.joined(separator: ", "))"
        return (samples, breakdown)
    }

    private static func uncontended(container: SharedContainer, rounds: Int) async throws -> (baton: [Double], raw: [Double]) {
        let role = try container.role("uncontended")
        var baton: [Double] = [], raw: [Double] = []
        let file = container.batonPath + "/bench-raw.lock"
        for round in 0..<(rounds + rounds / 10) {
            let start = monotonicNanoseconds()
            let lease = try await role.acquire(priority: .main, kind: "bench", deadline: .after(.seconds(5)))
            await lease.release()
            let middle = monotonicNanoseconds()
            let fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            flock(fd, LOCK_EX)
            close(fd)
            let end = monotonicNanoseconds()
            if round >= rounds / 10 {
                baton.append(Double(middle - start) / 1_000)
                raw.append(Double(end - middle) / 1_000)
            }
        }
        return (baton, raw)
    }

    // MARK: Workers

    static func worker(arguments: [String], container path: String) async throws {
        let container = try SharedContainer(path: path)
        let shm = try MappedFile(container, relativePath: shmName, minimumSize: 4096)
        switch arguments.first {
        case "flock-handoff":
            let fd = open(arguments[1], O_RDWR | O_CLOEXEC)
            emit("ready")
            var round: UInt32 = 0
            while true {
                round &+= 1
                SignalsBench.waitUntil(word(shm, goOffset), equals: round)
                flock(fd, LOCK_EX)
                baton_store64(stamp(shm, stampOffset), monotonicNanoseconds())
                flock(fd, LOCK_UN)
                baton_store32(word(shm, doneOffset), round)
                AddressWait.wakeAll(word(shm, doneOffset))
            }
        case "flock-waiter":
            let fd = open(arguments[1], O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw BatonError(.notFound, "cannot open \(arguments[1])") }
            emit("ready")
            flock(fd, LOCK_EX)
            baton_store64(stamp(shm, stampOffset), monotonicNanoseconds())
            baton_store32(word(shm, doneOffset), 1)
            AddressWait.wakeAll(word(shm, doneOffset))
            try await Task.sleep(for: .seconds(3600))
        case "signal-stamp":
            let observation = try container.signals.observe("bench.roles.ping")
            emit("ready")
            for await delivery in observation {
                baton_store64(stamp(shm, stampOffset), monotonicNanoseconds())
                baton_store32(word(shm, doneOffset), UInt32(truncatingIfNeeded: delivery.state))
                AddressWait.wakeAll(word(shm, doneOffset))
            }
        case "holder":
            let role = try container.role("bench")
            let lease = try await role.acquire(priority: .main, kind: "holder", deadline: .after(.seconds(30)))
            emit("ready \(lease.epoch)")
            try await Task.sleep(for: .seconds(3600))
            await lease.release()
        case "executor":
            let role = try container.role("preempt")
            let executor: (any TaskExecutor)? = arguments.dropFirst().first == "signal-thread" ? try container.signals.executor : nil
            while true {
                try await withTaskExecutorPreference(executor) {
                    let lease = try await role.acquire(priority: .executor, kind: "bench", deadline: .never)
                    emit("held \(lease.epoch)")
                    for await _ in lease.stopRequests { break }
                    baton_store64(stamp(shm, seenOffset), monotonicNanoseconds())
                    handOverTrace("roles.seen")
                    await lease.release()
                    baton_store64(stamp(shm, releasedOffset), monotonicNanoseconds())
                }
                // Ask again only once main is done, so that the figure is the preemption alone.
                guard readStandardInputLine() != nil else { return }
            }
        default:
            throw BatonError(.invalidArgument, "unknown roles worker \(arguments)")
        }
    }
}
