import Baton
import BatonDatabase
import BatonLoopback
import CBatonShims
import Synchronization
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// The whole app-plus-extension story, run for real: messages flow from the loopback server
/// while the app goes through foreground, background, suspension and termination, extensions
/// handle the pushes, and with chaos processes are killed and stalled at seeded random moments.
public struct Demo: Sendable {
    /// What to run.
    public struct Options: Sendable {
        /// Messages to send.
        public var messages = 60
        /// Length of the scripted part, in seconds (the drain at the end adds a little).
        public var seconds = 30.0
        /// Inject faults.
        public var chaos = false
        /// The seed of the message times and of the fault schedule.
        public var seed: UInt64 = 1
        /// The `baton` executable for the children.
        public var executable: String
        /// The shared container directory.
        public var container: String
        /// The extension memory limit, and what it counts (iOS: 24 MB of footprint, which
        /// ``Simulator/MemoryMeasure/dirty`` approximates).
        public var memoryLimit: UInt64 = 24 << 20
        public var memoryMeasure = Simulator.MemoryMeasure.dirty
        /// The 0xDEAD10CC rule applied at each suspension.
        public var rule = DeadLockRule.apple
        /// Called about once a second with a progress line.
        public var progress: (@Sendable (String) -> Void)?

        public init(executable: String, container: String) {
            self.executable = executable
            self.container = container
        }
    }

    public let options: Options

    public init(options: Options) { self.options = options }

    /// The app's script, as fractions of the run: the user actions of a ``Scenario``, performed
    /// by the same code as `baton simulate`'s.
    static let script: [(at: Double, step: Scenario.Step)] = [
        (0.00, .open), (0.10, .background), (0.14, .suspend),
        (0.26, .open), (0.36, .background), (0.40, .suspend),
        (0.50, .open), (0.56, .background), (0.60, .suspend), (0.66, .terminate),
        (0.84, .open),
    ]

    /// The messages' send times: seeded, some alone, some in bursts (several pushes at once).
    static func messageTimes(count: Int, seconds: Double, seed: UInt64) -> [Double] {
        var generator = SeededGenerator(seed: seed ^ 0x6D65_7373_6167_6573)
        var times: [Double] = []
        while times.count < count {
            let at = Double.random(in: 0.02...0.95, using: &generator) * seconds
            let burst = Int.random(in: 0..<4, using: &generator) == 0 ? Int.random(in: 3...6, using: &generator) : 1
            for index in 0..<min(burst, count - times.count) { times.append(at + Double(index) * 0.002) }
        }
        return times.sorted()
    }

    /// The fault schedule of a chaos run with these options (empty without chaos).
    public var faultPlan: FaultPlan {
        guard options.chaos else { return FaultPlan(faults: []) }
        return FaultPlan.random(seed: options.seed, window: (options.seconds * 0.05)...(options.seconds * 0.8), interval: max(1.0, options.seconds / 14))
    }

    /// Runs the demo and returns its report and timeline.
    /// - Throws: `simulationFailed` when the server or a process cannot start.
    public func run() async throws -> (report: DemoReport, timeline: Timeline) {
        let timeline = Timeline()
        let pushes = PushRelay()
        let server = try LoopbackServer(timeline: timeline) { id in pushes.deliver(id) }
        var configuration = Simulator.Configuration(executable: options.executable, container: options.container, serverPort: server.port)
        configuration.extensionMemoryLimit = options.memoryLimit
        configuration.memoryMeasure = options.memoryMeasure
        configuration.rule = options.rule
        let simulator = Simulator(configuration: configuration, timeline: timeline)
        pushes.attach(simulator)
        let plan = faultPlan
        // Message ids unique to this run, so that a reused container's inbox never holds them.
        let run = String(UInt32.random(in: 0...UInt32.max), radix: 36)
        let start = ContinuousClock.now
        func at(_ seconds: Double) async {
            try? await Task.sleep(until: start + .milliseconds(Int(seconds * 1000)), clock: .continuous)
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await server.run() }
            group.addTask { await simulator.run() }
            group.addTask {
                // Messages.
                for (index, time) in Self.messageTimes(count: options.messages, seconds: options.seconds, seed: options.seed).enumerated() {
                    await at(time)
                    let id = "\(run)-m\(String(index + 1).leftPadded(to: 4))"
                    server.send(id: id, payload: Array("payload-\(index + 1)".utf8))
                }
            }
            if !plan.faults.isEmpty {
                group.addTask { await simulator.run(plan, from: start) }
            }
            group.addTask {
                let interval = options.seconds >= 20 ? 5.0 : 2.0
                var next = interval
                while !Task.isCancelled {
                    await at(next)
                    if Task.isCancelled { break }
                    let counts = server.counts
                    let shown = Set(timeline.events.filter { $0.kind == .shown }.compactMap(\.message)).count
                    options.progress?("t=\(Int(next))s app \(simulator.appPhase.rawValue), sent \(counts.sent), shown \(shown), pending at server \(counts.pending), faults \(simulator.faultsInjected)")
                    next += interval
                }
            }
            // The app's life.
            for (fraction, step) in Self.script {
                await at(fraction * options.seconds)
                try await Scenario.perform(step, on: simulator)
            }
            // Drain: the user keeps the app open until every message is shown, or 20 s.
            await at(options.seconds)
            let drainEnd = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < drainEnd {
                if simulator.appPhase != .foreground { try await simulator.foregroundApp() }
                let sent = Set(timeline.events.filter { $0.kind == .sent }.compactMap(\.message))
                let shown = Set(timeline.events.filter { $0.kind == .shown }.compactMap(\.message))
                if sent.count == options.messages && sent.isSubset(of: shown) { break }
                // Show what extensions stored but did not show.
                simulator.app?.send(ChildCommand(.foreground))
                try await Task.sleep(for: .milliseconds(200))
            }
            await simulator.shutdown()
            group.cancelAll()
        }
        var report = DemoReport()
        // What is really in the store (a process killed right after storing never reported it;
        // one killed right after claiming a message for display never said it showed it).
        let inStore = try await Inbox.open(container: SharedContainer(path: options.container)).messages()
        report.tally(timeline.events, claims: Self.claimants(inStore))
        let stored = Set(inStore.map(\.id))
        let sentIDs = Set(timeline.events.filter { $0.kind == .sent }.compactMap(\.message))
        report.stored = stored.intersection(sentIDs).count
        report.overlappingConnections = server.overlappingConnections
        report.deadLockKills = simulator.deadLockKills
        report.deadLockKillRecords = simulator.deadLockKillRecords
        report.rule = options.rule
        report.extensionPeakResidentMiB = Double(simulator.peakExtensionResidentMemory) / 1_048_576
        report.extensionPeakDirtyMiB = Double(simulator.peakExtensionDirtyMemory) / 1_048_576
        report.memoryLimitMiB = Double(options.memoryLimit) / 1_048_576
        report.memoryMeasure = options.memoryMeasure.rawValue
        report.faultsInjected = simulator.faultsInjected
        report.faultSchedule = plan.faults.map(\.description)
        report.memoryLimitKills = simulator.limitKills["memory"] ?? 0
        report.timeLimitKills = simulator.limitKills["time"] ?? 0
        report.appLaunches = simulator.launches.apps
        report.extensionLaunches = simulator.launches.extensions
        report.pushes = simulator.pushes
        report.durationSeconds = Double((ContinuousClock.now - start).components.attoseconds) / 1e18 + Double((ContinuousClock.now - start).components.seconds)
        report.seed = options.seed
        report.chaos = options.chaos
        return (report, timeline)
    }
}

/// Hands the server's pushes to the simulator (created after the server, which needs the port).
final class PushRelay: Sendable {
    private let simulator = Mutex<Simulator?>(nil)
    func attach(_ simulator: Simulator) { self.simulator.withLock { $0 = simulator } }
    func deliver(_ id: String) { simulator.withLock { $0 }?.push(id) }
}

extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}

extension Demo {
    /// The name a simulated process claims messages for display under: its role and its pid
    /// (`extension pid N`, `app pid N`), so the demo can tell from the store which process
    /// holds a claim.
    static func claimant(_ role: String) -> String {
        "\(role) pid \(getpid())"
    }

    /// The pid of each message's claimant for display, read back from the names that
    /// ``claimant(_:)`` makes.
    static func claimants(_ messages: [InboxMessage]) -> [String: Int32] {
        var claims: [String: Int32] = [:]
        for message in messages {
            let words = (message.shownBy ?? "").split(separator: " ")
            guard words.count >= 2, words[words.count - 2] == "pid", let pid = Int32(words[words.count - 1]) else { continue }
            claims[message.id] = pid
        }
        return claims
    }
}
