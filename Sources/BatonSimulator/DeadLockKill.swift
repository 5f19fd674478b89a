/// A process the simulator killed at suspension (0xDEAD10CC), and why.
public struct DeadLockKill: Sendable, Hashable, CustomStringConvertible {
    /// Its lane (`app#1`).
    public var process: String
    public var pid: Int32
    /// The rule applied.
    public var rule: DeadLockRule
    /// The locks that broke it, each with its clause.
    public var violations: [DeadLockRule.Violation]

    public var description: String {
        let clauses = Set(violations.map(\.clause.rawValue)).sorted().joined(separator: ", ")
        return "killed under the \(rule.rawValue) rule (clause \(clauses)): held while suspended \(violations.map(\.description).joined(separator: "; "))"
    }
}
