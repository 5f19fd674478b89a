import ArgumentParser
import Baton
import BatonCommandSupport
import BatonSimulator

/// `baton simulate SCENARIO`: any program run as the app and as notification service
/// extensions under the iOS lifecycle, checked against the 0xDEAD10CC rule at every suspension.
struct SimulateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulate",
        abstract: "Run any program as an iOS app and its notification service extensions, and report 0xDEAD10CC kills.",
        discussion: """
        The scenario file (JSON) names the programs, the pushes, the user's actions (open, \
        background, suspend, lock, terminate) and the chaos. Each program follows the lifecycle \
        protocol: JSON lines on the descriptor BATON_LIFECYCLE_FD names (see the article \
        "Reproduce 0xDEAD10CC on Linux"). At every suspension the process is checked against the \
        0xDEAD10CC rule and killed if it breaks it. Exits non-zero when an invariant fails: a \
        0xDEAD10CC or limit kill, a push never shown or shown twice, two processes connected at once.
        """
    )

    @Argument(help: "The scenario file (JSON).") var scenario: String
    @Option(help: "The 0xDEAD10CC rule, overriding the scenario's: apple or strict.") var rule: DeadLockRule?
    @Flag(help: "Add seeded faults (kills and stalls) even if the scenario has none.") var chaos = false
    @Option(help: "The seed of the chaos schedule, overriding the scenario's.") var seed: UInt64?
    @Flag(help: "Print one JSON object on standard output (progress goes to standard error).") var json = false
    @Option(help: "Write the timeline as a self-contained HTML page.") var timeline: String?
    @Option(help: "Write every event of the run to this file, one JSON object a line.") var events: String?
    @Option(help: "Run in this container directory instead of a temporary one.") var container: String?

    func run() async throws {
        try checkRunContainer(container)
        if let timeline { try checkOutputPath(timeline, option: "--timeline") }
        if let events { try checkOutputPath(events, option: "--events") }
        var scenario = try Scenario.load(self.scenario)
        if let rule { scenario.rule = rule }
        if let seed {
            scenario.seed = seed
            scenario.chaos?.seed = seed
        }
        if chaos, scenario.chaos == nil { scenario.chaos = Scenario.Chaos(seed: scenario.seed) }
        let directory = try container ?? makeTemporaryDirectory(prefix: "baton-simulate")
        defer { if container == nil { removeTree(directory) } }
        let json = self.json
        var run = ScenarioRun(scenario: scenario, container: directory)
        run.progress = { line in if json { FileHandleOutput.standardError(line) } else { emit(line) } }
        if !json {
            emit("baton simulate: \(self.scenario), \(scenario.rule.rawValue) 0xDEAD10CC rule\(scenario.chaos != nil ? ", chaos seed \(scenario.chaos?.seed ?? scenario.seed)" : ""), container \(directory)")
        }
        let (report, recorded) = try await run.run()
        if let timeline {
            try write(TimelinePage.render(recorded, title: "baton simulate — \(self.scenario)", summary: summary(report)), to: timeline)
        }
        if let events { try writeEvents(recorded, to: events) }
        if json {
            emit(try jsonLine(object(report)))
        } else {
            let kills = report.deadLockKills.flatMap { kill in
                ["0xDEAD10CC: \(kill.process) (pid \(kill.pid))"] + kill.violations.map { "  \($0)" }
            }
            emitTextReport(summary(report), extra: kills, timeline: timeline, failures: report.failures)
        }
        if !report.failures.isEmpty { throw CommandOutcome(.absent, "INVARIANTS FAILED: \(report.failures.count) (see the report)") }
    }

    private func summary(_ report: ScenarioReport) -> [(String, String)] {
        [
            ("0xDEAD10CC rule", report.rule.rawValue),
            ("0xDEAD10CC kills", "\(report.deadLockKills.count)"),
            ("pushes / shown", "\(report.pushes) / \(report.shown)"),
            ("lost / shown twice", "\(report.lost.count) / \(report.shownTwice.count)"),
            ("overlapping connections", "\(report.overlappingConnections)"),
            ("suspensions", "\(report.suspensions)"),
            ("app / extension launches", "\(report.launches.apps) / \(report.launches.extensions)"),
            ("limit kills (memory/time)", "\(report.limitKills["memory"] ?? 0) / \(report.limitKills["time"] ?? 0)"),
            ("extension peak memory", "\(fixed(report.extensionPeakDirtyMiB)) MiB dirty"),
            ("faults injected", "\(report.faultsInjected)"),
            ("duration", "\(fixed(report.durationSeconds)) s"),
        ]
    }

    private func object(_ report: ScenarioReport) -> JSONValue {
        .object([
            "dead10cc_rule": .string(report.rule.rawValue),
            "dead10cc_kills": .int(report.deadLockKills.count),
            "dead10cc_kill_details": .array(report.deadLockKills.map(deadLockKillObject)),
            "pushes": .int(report.pushes),
            "shown": .int(report.shown),
            "lost_ids": .array(report.lost.map(JSONValue.string)),
            "shown_twice": .int(report.shownTwice.count),
            "overlapping_connections": .int(report.overlappingConnections),
            "suspensions": .int(report.suspensions),
            "app_launches": .int(report.launches.apps),
            "extension_launches": .int(report.launches.extensions),
            "memory_limit_kills": .int(report.limitKills["memory"] ?? 0),
            "time_limit_kills": .int(report.limitKills["time"] ?? 0),
            "extension_peak_dirty_mib": .double((report.extensionPeakDirtyMiB * 100).rounded() / 100),
            "faults_injected": .int(report.faultsInjected),
            "fault_schedule": .array(report.faultSchedule.map(JSONValue.string)),
            "errors": .array(report.errors.map(JSONValue.string)),
            "duration_s": .double((report.durationSeconds * 100).rounded() / 100),
            "seed": .int(Int(report.seed)),
            "failures": .array(report.failures.map(JSONValue.string)),
            "ok": .bool(report.failures.isEmpty),
        ])
    }
}
