/// What is known to be wrong, or to have been repaired, in a suite's files.
///
/// Damage the log's checksums reveal is never repaired by a process that only reads: it reads
/// around it (the valid records are kept; a record that fails its checksum is skipped, so the
/// keys it held show an older value, or none) and says so here. The next write repairs the file
/// under the writer lock, keeps the dropped bytes in a quarantine file, and records each loss
/// in the suite (``losses``): every process and every later ``SharedDefaults/verify()`` reports
/// it until ``SharedDefaults/acknowledgeRecovery()``. A rollback (a key back to a superseded
/// value, a removed key back) is a loss.
///
/// A torn tail (a write cut short by a crash) is not a loss: that write never completed, and
/// every key keeps its previous value.
public struct DefaultsRecoveryReport: Sendable, Hashable, CustomStringConvertible {
    /// Bytes of committed records that fail their checksum in the log as this process last
    /// read it (0 once a writer has repaired them: see ``losses``).
    public var corruptBytes = 0
    /// How many separate damaged regions those bytes form.
    public var corruptRegions = 0
    /// Bytes of an incomplete write (a crash in the middle of an append) dropped from the tail.
    public var droppedTailBytes = 0
    /// How many times this process repaired the log after a writer died holding the writer lock.
    public var crashRepairs = 0
    /// The log's header failed its check and was rewritten (its records were kept).
    public var headerRepaired = false
    /// Unacknowledged losses: those recorded in the suite by the writers that repaired them
    /// (with their quarantine files), then those this process found that no writer has
    /// repaired yet.
    public var losses: [DefaultsLoss] = []

    public init() {}

    /// Whether some committed data was lost (or rolled back) and not yet acknowledged.
    public var lostData: Bool { corruptBytes > 0 || losses.contains { $0.lostData } }

    /// Whether nothing at all was found.
    public var isClean: Bool {
        corruptBytes == 0 && droppedTailBytes == 0 && crashRepairs == 0 && !headerRepaired && losses.isEmpty
    }

    public var description: String {
        if isClean { return "clean" }
        var parts: [String] = losses.map(\.description)
        if corruptBytes > 0 && losses.isEmpty { parts.append("\(corruptBytes) corrupt bytes in \(corruptRegions) region(s) (values lost)") }
        if droppedTailBytes > 0 { parts.append("\(droppedTailBytes) bytes of an interrupted write dropped (a writer died mid-write; no value lost)") }
        if crashRepairs > 0 { parts.append("\(crashRepairs) repair(s) after a writer died") }
        if headerRepaired { parts.append("log header rewritten") }
        return parts.joined(separator: "; ")
    }
}
