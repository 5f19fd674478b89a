/// The figures of a simulation run, computed from its ``Timeline``, and its invariants.
public struct DemoReport: Sendable {
    public var sent = 0
    public var stored = 0
    public var shown = 0
    public var lost: [String] = []
    /// Messages claimed for display in the store by a process that was killed before it said it
    /// showed them (the claim committed, the process died before its `shown` event). iOS shows
    /// such a push with its original content when its extension dies, so they are not lost;
    /// counted apart from ``shown``.
    public var claimedByKilledProcess: [String] = []
    public var shownTwice: [String] = []
    public var overlappingConnections = 0
    public var deadLockKills = 0
    /// Each 0xDEAD10CC kill, with the file, the lock and the clause.
    public var deadLockKillRecords: [DeadLockKill] = []
    /// The 0xDEAD10CC rule applied.
    public var rule = DeadLockRule.apple
    /// Peak resident memory (VmHWM) of any extension process.
    public var extensionPeakResidentMiB = 0.0
    /// Peak dirty memory (what iOS's limit counts) of any extension process.
    public var extensionPeakDirtyMiB = 0.0
    /// The limit and what it counted (`dirty` or `resident`).
    public var memoryLimitMiB = 24.0
    public var memoryMeasure = "dirty"
    public var sendToShownMilliseconds: (p50: Double, p99: Double) = (0, 0)
    public var handovers = 0
    public var faultsInjected = 0
    public var faultSchedule: [String] = []
    public var memoryLimitKills = 0
    public var timeLimitKills = 0
    public var appLaunches = 0
    public var extensionLaunches = 0
    public var pushes = 0
    /// The most extension instances that ran at once in one process (iOS runs several as
    /// threads of one process).
    public var maximumConcurrentInstances = 0
    public var connections = 0
    public var suspensions = 0
    public var durationSeconds = 0.0
    public var seed: UInt64 = 0
    public var chaos = false

    public init() {}

    /// The invariants that failed, in words; empty when the run was correct.
    public var failures: [String] {
        var failures: [String] = []
        if !lost.isEmpty { failures.append("\(lost.count) message(s) never shown: \(lost.prefix(10).joined(separator: ", "))") }
        if !shownTwice.isEmpty { failures.append("\(shownTwice.count) message(s) shown more than once: \(shownTwice.prefix(10).joined(separator: ", "))") }
        if overlappingConnections > 0 { failures.append("\(overlappingConnections) time(s) two cores were connected at once") }
        if deadLockKills > 0 { failures.append("\(deadLockKills) process(es) killed for holding a lock while suspended (0xDEAD10CC, \(rule.rawValue) rule)") }
        for kill in deadLockKillRecords { failures.append("0xDEAD10CC: \(kill.process) (pid \(kill.pid)) \(kill)") }
        if memoryLimitKills > 0 { failures.append("\(memoryLimitKills) extension process(es) killed for passing the memory limit (\(memoryMeasure) memory over \(Int(memoryLimitMiB)) MiB)") }
        if timeLimitKills > 0 { failures.append("\(timeLimitKills) extension process(es) killed for passing the time limit") }
        if stored < sent { failures.append("only \(stored) of \(sent) messages were stored") }
        return failures
    }

    /// Computes the message figures from the events and, when given, the store's claims:
    /// `claims` maps each message claimed for display to the pid of its claimant.
    package mutating func tally(_ events: [SimulatorEvent], claims: [String: Int32] = [:]) {
        var sentAt: [String: UInt64] = [:]
        var storedIDs = Set<String>()
        var shownCount: [String: Int] = [:]
        var firstShown: [String: UInt64] = [:]
        var lastHolder: Int32?
        var activeInstances: [Int32: Int] = [:]
        for event in events {
            switch event.kind {
            case .sent:
                if let id = event.message { sentAt[id] = event.time }
            case .stored:
                if let id = event.message { storedIDs.insert(id) }
            case .shown:
                if let id = event.message {
                    shownCount[id, default: 0] += 1
                    if firstShown[id] == nil { firstShown[id] = event.time }
                }
            case .roleAcquired:
                if let lastHolder, lastHolder != event.pid { handovers += 1 }
                lastHolder = event.pid
            case .instanceStarted:
                activeInstances[event.pid, default: 0] += 1
                maximumConcurrentInstances = max(maximumConcurrentInstances, activeInstances[event.pid] ?? 0)
            case .instanceFinished:
                activeInstances[event.pid, default: 1] -= 1
            case .killed, .exited:
                activeInstances[event.pid] = nil
            case .connectionOpened:
                connections += 1
            case .suspended:
                suspensions += 1
            default:
                break
            }
        }
        sent = sentAt.count
        stored = storedIDs.intersection(sentAt.keys).count
        shown = Set(shownCount.keys).intersection(sentAt.keys).count
        let killed = Set(events.filter { $0.kind == .killed }.map(\.pid))
        let unreported = sentAt.keys.filter { shownCount[$0] == nil }
        let byKilled = Set(unreported.filter { claims[$0].map(killed.contains) == true })
        claimedByKilledProcess = byKilled.sorted()
        lost = unreported.filter { !byKilled.contains($0) }.sorted()
        shownTwice = shownCount.filter { $0.value > 1 }.map(\.key).sorted()
        let latencies = firstShown.compactMap { id, shown -> Double? in
            guard let sent = sentAt[id], shown >= sent else { return nil }
            return Double(shown - sent) / 1e6
        }.sorted()
        func percentile(_ p: Double) -> Double {
            guard !latencies.isEmpty else { return 0 }
            let rank = Int((p / 100 * Double(latencies.count)).rounded(.up)) - 1
            return latencies[min(max(rank, 0), latencies.count - 1)]
        }
        sendToShownMilliseconds = (percentile(50), percentile(99))
    }
}
