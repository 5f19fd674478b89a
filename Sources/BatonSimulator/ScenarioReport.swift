/// The outcome of a ``ScenarioRun`` and its invariants.
public struct ScenarioReport: Sendable {
    /// The 0xDEAD10CC rule applied.
    public var rule: DeadLockRule
    public var seed: UInt64
    public var pushes = 0
    /// Pushes reported `shown`.
    public var shown = 0
    /// Pushes never reported `shown` (when the scenario expects every push shown).
    public var lost: [String] = []
    public var shownTwice: [String] = []
    /// Times two processes reported `connected` at once.
    public var overlappingConnections = 0
    public var suspensions = 0
    public var deadLockKills: [DeadLockKill] = []
    public var limitKills: [String: Int] = [:]
    public var faultsInjected = 0
    public var faultSchedule: [String] = []
    public var launches: (apps: Int, extensions: Int) = (0, 0)
    public var extensionPeakDirtyMiB = 0.0
    public var durationSeconds = 0.0
    /// Errors the programs reported.
    public var errors: [String] = []

    public init(rule: DeadLockRule, seed: UInt64) {
        self.rule = rule
        self.seed = seed
    }

    /// The invariants that failed, in words; empty when the run was correct.
    public var failures: [String] {
        var failures: [String] = []
        for kill in deadLockKills { failures.append("0xDEAD10CC: \(kill.process) (pid \(kill.pid)) \(kill)") }
        for (reason, count) in limitKills.sorted(by: { $0.key < $1.key }) where count > 0 {
            failures.append("\(count) extension process(es) killed for passing the \(reason) limit")
        }
        if !lost.isEmpty { failures.append("\(lost.count) push(es) never shown: \(lost.prefix(10).joined(separator: ", "))") }
        if !shownTwice.isEmpty { failures.append("\(shownTwice.count) push(es) shown more than once: \(shownTwice.prefix(10).joined(separator: ", "))") }
        if overlappingConnections > 0 { failures.append("\(overlappingConnections) time(s) two processes were connected at once") }
        return failures
    }

    mutating func tally(_ events: [SimulatorEvent], pushes ids: [String], expectEveryPushShown: Bool) {
        pushes = ids.count
        var shownCount: [String: Int] = [:]
        var connected = Set<Int32>()
        for event in events {
            switch event.kind {
            case .shown:
                if let id = event.message { shownCount[id, default: 0] += 1 }
            case .connected:
                connected.insert(event.pid)
                if connected.count > 1 { overlappingConnections += 1 }
            case .disconnected, .killed, .exited:
                connected.remove(event.pid)
            case .error:
                errors.append("\(event.process): \(event.detail ?? "error")")
            default:
                break
            }
            if event.kind == .suspended { suspensions += 1 }
        }
        let pushed = Set(ids)
        shown = Set(shownCount.keys).intersection(pushed).count
        if expectEveryPushShown { lost = pushed.filter { shownCount[$0] == nil }.sorted() }
        shownTwice = shownCount.filter { $0.value > 1 }.map(\.key).sorted()
    }
}
