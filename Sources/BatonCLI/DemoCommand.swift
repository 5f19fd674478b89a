import ArgumentParser
import Baton
import BatonCommandSupport
import BatonSimulator
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// `baton demo`: the app-plus-extension story, run for real with the simulator.
struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Run an app and its extensions for real: messages, suspension, pushes, and (with --chaos) crashes.",
        discussion: """
        Messages flow from a loopback server while the app goes through foreground, background, \
        suspension and termination; extension processes handle the pushes. With --chaos, processes \
        are killed (SIGKILL) and stalled (SIGSTOP) at seeded random moments. Exits non-zero when a \
        message is lost or shown twice, two cores were connected at once, or a process was killed \
        for holding a lock while suspended.
        """
    )

    @Option(help: "Messages to send.", transform: ArgumentCheck.count) var messages: Int = 60
    @Option(help: "Length of the scripted run, in seconds (a short drain follows).", transform: ArgumentCheck.seconds) var seconds: Double = 30.0
    @Flag(help: "Kill and stall processes at random moments.") var chaos = false
    @Option(help: "Seed of the message times and the fault schedule (default: random).") var seed: UInt64?
    @Flag(help: "Print one JSON object on standard output (progress goes to standard error).") var json = false
    @Option(help: "Write the timeline as a self-contained HTML page.") var timeline: String?
    @Option(help: "Run in this container directory instead of a temporary one.") var container: String?
    @Option(help: "The extension memory limit in MiB (iOS: 24).", transform: ArgumentCheck.positiveCount) var memoryLimit: Int = 24
    @Option(help: "What the memory limit counts: dirty (what iOS counts: pages the process wrote) or resident (VmRSS, which also counts the clean pages of shared libraries).")
    var memoryMeasure = "dirty"
    @Option(help: "Write every event of the run to this file, one JSON object a line.") var events: String?
    @Option(help: "The 0xDEAD10CC rule: apple (TN2408: plain file locks, rollback-journal or unrecognised databases, WAL write transactions) or strict (any lock in the container).")
    var rule: DeadLockRule = .apple

    func validate() throws {
        guard messages >= 1, messages <= 10_000 else { throw ValidationError("--messages must be 1 to 10000") }
        guard Simulator.MemoryMeasure(rawValue: memoryMeasure) != nil else { throw ValidationError("--memory-measure must be dirty or resident") }
        guard memoryLimit >= 1 else { throw ValidationError("--memory-limit must be at least 1 MiB") }
        guard seconds >= 3, seconds <= 3600 else { throw ValidationError("--seconds must be 3 to 3600") }
    }

    func run() async throws {
        try checkRunContainer(container)
        if let timeline { try checkOutputPath(timeline, option: "--timeline") }
        if let events { try checkOutputPath(events, option: "--events") }
        let directory = try container ?? makeTemporaryDirectory(prefix: "baton-demo")
        defer { if container == nil { removeTree(directory) } }
        let seed = self.seed ?? UInt64.random(in: 1...999_999)
        var options = Demo.Options(executable: selfExecutable(), container: directory)
        options.messages = messages
        options.seconds = seconds
        options.chaos = chaos
        options.seed = seed
        options.memoryLimit = UInt64(memoryLimit) << 20
        options.memoryMeasure = Simulator.MemoryMeasure(rawValue: memoryMeasure) ?? .dirty
        options.rule = rule
        let json = self.json
        options.progress = { line in
            if json { FileHandleOutput.standardError(line) } else { emit(line) }
        }
        if !json {
            emit("baton demo: \(messages) messages over \(Int(seconds)) s\(chaos ? " with chaos" : ""), seed \(seed), \(rule.rawValue) 0xDEAD10CC rule, container \(directory)")
        }
        let (report, recorded) = try await Demo(options: options).run()
        if let timeline {
            let page = TimelinePage.render(recorded, title: "baton demo — \(report.sent) messages, seed \(seed)\(chaos ? ", chaos" : "")", summary: summary(report))
            try write(page, to: timeline)
        }
        if let events { try writeEvents(recorded, to: events) }
        if json {
            emit(try jsonLine(object(report)))
        } else {
            let schedule = report.faultSchedule.isEmpty ? [] : ["fault schedule: \(report.faultSchedule.joined(separator: "; "))"]
            emitTextReport(summary(report), extra: schedule, timeline: timeline, failures: report.failures)
        }
        if !report.failures.isEmpty { throw CommandOutcome(.absent, "INVARIANTS FAILED: \(report.failures.count) (see the report)") }
    }

    private func summary(_ report: DemoReport) -> [(String, String)] {
        [
            ("sent / stored / shown", "\(report.sent) / \(report.stored) / \(report.shown)"),
            ("lost", "\(report.lost.count)"),
            ("claimed by a process killed before it reported", "\(report.claimedByKilledProcess.count) (iOS shows these with the push's original content)"),
            ("shown twice", "\(report.shownTwice.count)"),
            ("overlapping connections", "\(report.overlappingConnections)"),
            ("0xDEAD10CC rule", report.rule.rawValue),
            ("0xDEAD10CC kills", "\(report.deadLockKills)"),
            ("send to shown (ms)", "p50 \(fixed(report.sendToShownMilliseconds.p50)), p99 \(fixed(report.sendToShownMilliseconds.p99))"),
            ("core handovers", "\(report.handovers)"),
            ("connections", "\(report.connections)"),
            ("suspensions", "\(report.suspensions)"),
            ("app / extension launches", "\(report.appLaunches) / \(report.extensionLaunches)"),
            ("pushes", "\(report.pushes) (at most \(report.maximumConcurrentInstances) at once in one extension process)"),
            ("extension peak memory", "\(fixed(report.extensionPeakDirtyMiB)) MiB dirty, \(fixed(report.extensionPeakResidentMiB)) MiB resident (limit \(Int(report.memoryLimitMiB)) MiB \(report.memoryMeasure))"),
            ("limit kills (memory/time)", "\(report.memoryLimitKills) / \(report.timeLimitKills)"),
            ("faults injected", "\(report.faultsInjected)"),
            ("duration", "\(fixed(report.durationSeconds)) s"),
        ]
    }

    private func object(_ report: DemoReport) -> JSONValue {
        .object([
            "sent": .int(report.sent),
            "stored": .int(report.stored),
            "shown": .int(report.shown),
            "lost": .int(report.lost.count),
            "lost_ids": .array(report.lost.map(JSONValue.string)),
            "claimed_by_killed_process": .int(report.claimedByKilledProcess.count),
            "claimed_by_killed_process_ids": .array(report.claimedByKilledProcess.map(JSONValue.string)),
            "shown_twice": .int(report.shownTwice.count),
            "overlapping_connections": .int(report.overlappingConnections),
            "dead10cc_rule": .string(report.rule.rawValue),
            "dead10cc_kills": .int(report.deadLockKills),
            "dead10cc_kill_details": .array(report.deadLockKillRecords.map(deadLockKillObject)),
            "extension_peak_rss_mib": .double((report.extensionPeakResidentMiB * 100).rounded() / 100),
            "extension_peak_dirty_mib": .double((report.extensionPeakDirtyMiB * 100).rounded() / 100),
            "memory_limit": .object(["mib": .double(report.memoryLimitMiB), "measure": .string(report.memoryMeasure)]),
            "send_to_shown_ms": .object([
                "p50": .double((report.sendToShownMilliseconds.p50 * 100).rounded() / 100),
                "p99": .double((report.sendToShownMilliseconds.p99 * 100).rounded() / 100),
            ]),
            "handovers": .int(report.handovers),
            "faults_injected": .int(report.faultsInjected),
            "fault_schedule": .array(report.faultSchedule.map(JSONValue.string)),
            "memory_limit_kills": .int(report.memoryLimitKills),
            "time_limit_kills": .int(report.timeLimitKills),
            "connections": .int(report.connections),
            "suspensions": .int(report.suspensions),
            "app_launches": .int(report.appLaunches),
            "extension_launches": .int(report.extensionLaunches),
            "pushes": .int(report.pushes),
            "max_instances_in_one_extension": .int(report.maximumConcurrentInstances),
            "duration_s": .double((report.durationSeconds * 100).rounded() / 100),
            "seed": .int(Int(report.seed)),
            "chaos": .bool(report.chaos),
            "failures": .array(report.failures.map(JSONValue.string)),
            "ok": .bool(report.failures.isEmpty),
        ])
    }
}

extension DeadLockRule: ExpressibleByArgument {}

/// A 0xDEAD10CC kill as JSON: the process, the rule, and each lock with its file, kind, byte range and clause.
func deadLockKillObject(_ kill: DeadLockKill) -> JSONValue {
    .object([
        "process": .string(kill.process),
        "pid": .int(Int(kill.pid)),
        "rule": .string(kill.rule.rawValue),
        "locks": .array(kill.violations.map { violation in
            .object([
                "file": .string(violation.lock.path),
                "kind": .string(violation.lock.kind),
                "mode": .string(violation.lock.exclusive ? "write" : "read"),
                "start": .int(Int(violation.lock.start)),
                "end": violation.lock.end.map { .int(Int($0)) } ?? .string("EOF"),
                "range": .string(violation.lock.range),
                "clause": .string(violation.clause.rawValue),
                "clause_text": .string(violation.clause.summary),
                "reason": .string(violation.reason),
            ])
        }),
    ])
}
