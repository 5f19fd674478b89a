import Baton
import CBatonShims

/// Runs a ``Scenario``: its programs under the simulator's iOS lifecycle, its pushes, its user
/// actions and its chaos, then checks the invariants.
public struct ScenarioRun: Sendable {
    public let scenario: Scenario
    /// The shared container directory.
    public let container: String
    /// Called with a progress line now and then.
    public var progress: (@Sendable (String) -> Void)?

    public init(scenario: Scenario, container: String) {
        self.scenario = scenario
        self.container = container
    }

    /// The simulator's configuration for this scenario.
    var configuration: Simulator.Configuration {
        // No loopback server: the programs bring their own network, if any.
        var configuration = Simulator.Configuration(executable: "/proc/self/exe", container: container, serverPort: 0)
        configuration.appProgram = scenario.app
        configuration.extensionProgram = scenario.extension
        configuration.rule = scenario.rule
        configuration.extensionTimeLimit = .milliseconds(Int(scenario.limits.extensionSeconds * 1000))
        configuration.extensionMemoryLimit = UInt64(scenario.limits.extensionMemoryMib) << 20
        configuration.memoryMeasure = Simulator.MemoryMeasure(rawValue: scenario.limits.memoryMeasure) ?? .dirty
        configuration.suspensionGrace = .milliseconds(scenario.limits.suspensionGraceMs)
        configuration.suspendsIdleExtensions = true
        configuration.extensionIdleLifetime = .milliseconds(Int(scenario.limits.extensionIdleSeconds * 1000))
        return configuration
    }

    /// Runs the scenario.
    /// - Returns: Its report and timeline.
    /// - Throws: `invalidArgument` for a scenario that acts on a program it does not name;
    ///   `simulationFailed` when a program cannot start.
    public func run() async throws -> (report: ScenarioReport, timeline: Timeline) {
        if scenario.app == nil, !scenario.actions.isEmpty {
            throw BatonError(.invalidArgument, "the scenario has actions on the app but no \"app\" program")
        }
        if scenario.extension == nil, !scenario.pushes.isEmpty {
            throw BatonError(.invalidArgument, "the scenario has pushes but no \"extension\" program")
        }
        let timeline = Timeline()
        let simulator = Simulator(configuration: configuration, timeline: timeline)
        let plan = scenario.faultPlan
        let start = ContinuousClock.now
        func at(_ seconds: Double) async {
            try? await Task.sleep(until: start + .milliseconds(Int(seconds * 1000)), clock: .continuous)
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await simulator.run() }
            group.addTask {
                for push in scenario.pushes.sorted(by: { $0.at < $1.at }) {
                    await at(push.at)
                    simulator.push(push.id, payload: push.payload)
                }
            }
            if !plan.faults.isEmpty {
                group.addTask { await simulator.run(plan, from: start) }
            }
            for action in scenario.timedActions {
                await at(action.at)
                progress?("t=\(String(format2(action.at)))s \(action.do.rawValue)")
                try await Scenario.perform(action.do, on: simulator)
            }
            await at(scenario.seconds)
            // Wait (at most the extension time limit) for the pushes still being handled.
            let expected = Set(scenario.pushes.map(\.id))
            let drainEnd = ContinuousClock.now + .milliseconds(Int(scenario.limits.extensionSeconds * 1000) + 1000)
            while ContinuousClock.now < drainEnd {
                let done = Set(timeline.events.filter { $0.kind == .instanceFinished || $0.kind == .shown }.compactMap(\.message))
                if expected.isSubset(of: done) { break }
                try await Task.sleep(for: .milliseconds(100))
            }
            await simulator.shutdown()
            group.cancelAll()
        }
        var report = ScenarioReport(rule: scenario.rule, seed: scenario.chaos?.seed ?? scenario.seed)
        report.tally(timeline.events, pushes: scenario.pushes.map(\.id), expectEveryPushShown: scenario.expectEveryPushShown)
        report.deadLockKills = simulator.deadLockKillRecords
        report.limitKills = simulator.limitKills
        report.faultsInjected = simulator.faultsInjected
        report.faultSchedule = plan.faults.map(\.description)
        report.launches = simulator.launches
        report.extensionPeakDirtyMiB = Double(simulator.peakExtensionDirtyMemory) / 1_048_576
        let elapsed = (ContinuousClock.now - start).components
        report.durationSeconds = Double(elapsed.seconds) + Double(elapsed.attoseconds) / 1e18
        return (report, timeline)
    }
}

func format2(_ value: Double) -> String { "\((value * 100).rounded() / 100)" }
