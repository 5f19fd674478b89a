import Baton
import BatonCommandSupport
import CBatonShims

/// `baton bench signals`: post-to-wake latency between two processes and the fan-out to 16
/// watchers, beside a raw futex ping-pong, a raw futex wake of 16 sleepers and a pipe ping-pong
/// measured in the same run.
enum SignalsBench: BenchSuite {
    static let name = "signals"
    static let shmName = "bench-signals.shm"
    static let fanout = 16

    // Layout of the shared bench page.
    static let pingOffset = 0, fanOffset = 64, doneOffset = 128, stampOffset = 192, slotsOffset = 256
    /// While nonzero, each fan-out worker writes its process's processor time in its slot at
    /// `cpuSlotsOffset` when it reports (two rounds of a run: the first measured, the last).
    static let cpuFlagOffset = 448, cpuSlotsOffset = 512

    static func run(container path: String, quick: Bool) async throws -> (results: [BenchResult], notes: [String: String]) {
        let container = try SharedContainer(path: path)
        let shm = try MappedFile(container, relativePath: shmName, minimumSize: 4096)
        let rounds = quick ? 2_000 : 20_000
        let fanRounds = quick ? 50 : 300

        // Floors and Baton alternate in blocks, so that each ratio compares runs made under the
        // same conditions (on these machines the futex floor moves 10x with core placement).
        let blocks = 4
        var futexOneWay: [Double] = [], pipeOneWay: [Double] = [], signalOneWay: [Double] = []
        var fanFutex: [Double] = [], fanSignals: [Double] = []
        var fanFutexCPU: [Double] = [], fanSignalsCPU: [Double] = []
        let signals = try container.signals
        for block in 1...blocks {
            FileHandleOutput.standardError("signals: block \(block)/\(blocks): ping-pongs (futex, pipe, Baton)")
            futexOneWay += try pingPongFutex(container: path, shm: shm, rounds: rounds / blocks)
            pipeOneWay += try pingPongPipe(container: path, rounds: rounds / blocks)
            signalOneWay += try await pingPongSignals(container: container, path: path, rounds: rounds / blocks)
            FileHandleOutput.standardError("signals: block \(block)/\(blocks): fan-out to \(fanout) processes (futex, Baton)")
            let futexRun = try fanOut(container: path, shm: shm, rounds: fanRounds / blocks, mode: "futex-fan", post: {
                baton_add32(word(shm, fanOffset), 1)
                AddressWait.wakeAll(word(shm, fanOffset))
            })
            let signalsRun = try fanOut(container: path, shm: shm, rounds: fanRounds / blocks, mode: "signal-fan", post: {
                try signals.post("bench.fan", state: monotonicNanoseconds())
            })
            fanFutex += futexRun.samples
            fanSignals += signalsRun.samples
            fanFutexCPU += futexRun.processorPerWake
            fanSignalsCPU += signalsRun.processorPerWake
        }

        let futexP50 = percentile(futexOneWay, 50), futexP99 = percentile(futexOneWay, 99)
        let results = [
            BenchResult(name: "post_to_wake_p50_us", value: percentile(signalOneWay, 50), unit: "us", floorName: "futex_pingpong_p50_us", floor: futexP50),
            BenchResult(name: "post_to_wake_p99_us", value: percentile(signalOneWay, 99), unit: "us", floorName: "futex_pingpong_p99_us", floor: futexP99),
            BenchResult(name: "fanout16_last_wake_p50_us", value: percentile(fanSignals, 50), unit: "us", floorName: "futex_wake16_last_p50_us", floor: percentile(fanFutex, 50)),
            BenchResult(name: "fanout16_last_wake_p99_us", value: percentile(fanSignals, 99), unit: "us", floorName: "futex_wake16_last_p99_us", floor: percentile(fanFutex, 99)),
            BenchResult(name: "fanout16_cpu_per_wake_us", value: percentile(fanSignalsCPU, 50), unit: "us", floorName: "futex_wake16_cpu_per_wake_us", floor: percentile(fanFutexCPU, 50)),
            BenchResult(name: "pipe_pingpong_p50_us", value: percentile(pipeOneWay, 50), unit: "us", floorName: "futex_pingpong_p50_us", floor: futexP50),
        ]
        return (results, [
            "method": "one-way latency = round trip / 2 between two processes (\(rounds) rounds after warm-up); fan-out = time until the last of \(fanout) sleeping processes wakes (\(fanRounds) rounds), and the processor time each of them spends per wake-up (median over the processes of their process time across the measured rounds, divided by the rounds); floors and Baton alternate in \(blocks) blocks; Baton's observers run on Signals.executor (the signal thread)",
            "cores": "\(sysconf(Int32(_SC_NPROCESSORS_ONLN)))",
        ])
    }

    /// The processor time this process has used, in nanoseconds (`CLOCK_PROCESS_CPUTIME_ID`).
    static func processorNanoseconds() -> UInt64 {
        var time = timespec()
        guard clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time) == 0 else { return 0 }
        return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
    }

    static func word(_ shm: MappedFile, _ offset: Int) -> UnsafeMutablePointer<UInt32> {
        shm.pointer.advanced(by: offset).assumingMemoryBound(to: UInt32.self)
    }

    static func waitUntil(_ pointer: UnsafeMutablePointer<UInt32>, equals target: UInt32) {
        while true {
            let value = baton_load32(pointer)
            if value == target { return }
            _ = AddressWait.wait(on: pointer, expecting: value, timeoutNanoseconds: -1)
        }
    }

    // MARK: Ping-pongs

    private static func pingPongFutex(container: String, shm: MappedFile, rounds: Int) throws -> [Double] {
        let ping = word(shm, pingOffset)
        baton_store32(ping, 0)
        let worker = try WorkerProcess(suite: name, container: container, arguments: ["futex-pong"])
        try worker.waitReady()
        defer { withExtendedLifetime(worker) {} }
        var samples: [Double] = []
        samples.reserveCapacity(rounds)
        let warmup = rounds / 10
        var value: UInt32 = 0
        for index in 0..<(rounds + warmup) {
            let start = monotonicNanoseconds()
            value &+= 1
            baton_store32(ping, value)
            AddressWait.wakeAll(ping)
            value &+= 1
            waitUntil(ping, equals: value)
            if index >= warmup { samples.append(Double(monotonicNanoseconds() - start) / 2_000) }
        }
        return samples
    }

    private static func pingPongPipe(container: String, rounds: Int) throws -> [Double] {
        let worker = try WorkerProcess(suite: name, container: container, arguments: ["pipe-pong"])
        try worker.waitReady()
        var samples: [Double] = []
        let warmup = rounds / 10
        var byte: UInt8 = 1
        for index in 0..<(rounds + warmup) {
            let start = monotonicNanoseconds()
            _ = write(worker.input, &byte, 1)
            _ = read(worker.output, &byte, 1)
            if index >= warmup { samples.append(Double(monotonicNanoseconds() - start) / 2_000) }
        }
        return samples
    }

    private static func pingPongSignals(container: SharedContainer, path: String, rounds: Int) async throws -> [Double] {
        let signals = try container.signals
        let pongs = try signals.observe("bench.pong")
        let worker = try WorkerProcess(suite: name, container: path, arguments: ["signal-pong"])
        try worker.waitReady()
        defer { withExtendedLifetime(worker) {} }
        let warmup = rounds / 10
        // Both sides run on their signal threads (`Signals.executor`): no second thread hop.
        return try await withTaskExecutorPreference(signals.executor) {
            var samples: [Double] = []
            for index in 0..<(rounds + warmup) {
                let start = monotonicNanoseconds()
                try signals.post("bench.ping", state: UInt64(index))
                _ = try await pongs.next(deadline: .after(.seconds(5)))
                if index >= warmup { samples.append(Double(monotonicNanoseconds() - start) / 2_000) }
            }
            return samples
        }
    }

    // MARK: Fan-out

    /// One fan-out run: the time until the last worker woke, per round, and each worker's
    /// processor time per round (µs) between the first measured round and the last.
    private static func fanOut(container: String, shm: MappedFile, rounds: Int, mode: String, post: () throws -> Void) throws -> (samples: [Double], processorPerWake: [Double]) {
        let done = word(shm, doneOffset)
        baton_store32(done, 0)
        let cpuFlag = word(shm, cpuFlagOffset)
        baton_store32(cpuFlag, 0)
        /// The workers' 64-bit slots at `offset`.
        func slots(_ offset: Int) -> [UInt64] {
            (0..<fanout).map { baton_load64(shm.pointer.advanced(by: offset + $0 * 8).assumingMemoryBound(to: UInt64.self)) }
        }
        var firstTimes: [UInt64] = [], lastTimes: [UInt64] = []
        let workers = try (0..<fanout).map { index in
            try WorkerProcess(suite: name, container: container, arguments: [mode, String(index)])
        }
        for worker in workers { try worker.waitReady() }
        defer { withExtendedLifetime(workers) {} }
        var samples: [Double] = []
        let stamp = shm.pointer.advanced(by: stampOffset).assumingMemoryBound(to: UInt64.self)
        let warmup = 5, firstMeasured = warmup + 1, lastRound = rounds + warmup
        for round in 1...lastRound {
            usleep(2_000) // let every worker go back to sleep
            baton_store32(cpuFlag, round == firstMeasured || round == lastRound ? 1 : 0)
            baton_store64(stamp, monotonicNanoseconds())
            try post()
            waitUntil(done, equals: UInt32(round * fanout))
            if round == firstMeasured { firstTimes = slots(cpuSlotsOffset) }
            if round == lastRound { lastTimes = slots(cpuSlotsOffset) }
            if round > warmup {
                samples.append(Double(slots(slotsOffset).max()!) / 1_000)
            }
        }
        let perWake = zip(firstTimes, lastTimes).map { Double($1 &- $0) / 1_000 / Double(max(rounds - 1, 1)) }
        return (samples, perWake)
    }

    // MARK: Workers

    static func worker(arguments: [String], container path: String) async throws {
        let container = try SharedContainer(path: path)
        let shm = try MappedFile(container, relativePath: shmName, minimumSize: 4096)
        switch arguments.first {
        case "futex-pong":
            let ping = word(shm, pingOffset)
            emit("ready")
            var value: UInt32 = 0
            while true {
                value &+= 1
                waitUntil(ping, equals: value)
                value &+= 1
                baton_store32(ping, value)
                AddressWait.wakeAll(ping)
            }
        case "pipe-pong":
            emit("ready")
            var byte: UInt8 = 0
            while read(0, &byte, 1) == 1 { _ = write(1, &byte, 1) }
        case "signal-pong":
            let signals = try container.signals
            let pings = try signals.observe("bench.ping")
            emit("ready")
            try await withTaskExecutorPreference(signals.executor) {
                for await delivery in pings { try signals.post("bench.pong", state: delivery.state) }
            }
        case "signal-post-stdin":
            // Posts `bench.fan` for each byte read, and echoes the byte: a long-lived poster for
            // `scripts/signal-wake-cpu.py`.
            let signals = try container.signals
            emit("ready")
            var byte: UInt8 = 0
            while read(0, &byte, 1) == 1 { try signals.post("bench.fan"); _ = write(1, &byte, 1) }
        case "futex-fan", "signal-fan":
            let index = Int(arguments[1])!
            let slot = shm.pointer.advanced(by: slotsOffset + index * 8).assumingMemoryBound(to: UInt64.self)
            let stamp = shm.pointer.advanced(by: stampOffset).assumingMemoryBound(to: UInt64.self)
            let done = word(shm, doneOffset)
            let cpuFlag = word(shm, cpuFlagOffset)
            let cpuSlot = shm.pointer.advanced(by: cpuSlotsOffset + index * 8).assumingMemoryBound(to: UInt64.self)
            func report() {
                baton_store64(slot, monotonicNanoseconds() &- baton_load64(stamp))
                if baton_load32(cpuFlag) != 0 { baton_store64(cpuSlot, processorNanoseconds()) }
                baton_add32(done, 1)
                AddressWait.wakeAll(done)
            }
            if arguments[0] == "futex-fan" {
                let fan = word(shm, fanOffset)
                var seen = baton_load32(fan)
                emit("ready")
                while true {
                    _ = AddressWait.wait(on: fan, expecting: seen, timeoutNanoseconds: -1)
                    let now = baton_load32(fan)
                    if now != seen { seen = now; report() }
                }
            } else {
                let signals = try container.signals
                let observation = try signals.observe("bench.fan")
                emit("ready")
                await withTaskExecutorPreference(signals.executor) {
                    for await _ in observation { report() }
                }
            }
        default:
            throw BatonError(.invalidArgument, "unknown signals worker \(arguments)")
        }
    }
}
