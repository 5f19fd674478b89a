/// What ``SharedDefaults`` found and repaired while reading its log in this process.
///
/// Corruption (a record whose checksum fails, with valid records after it) loses the values in
/// that record: the valid records are kept, the damaged ones are dropped from the file at the
/// next write, and the loss is counted here. A torn tail (a write cut short by a crash) is not
/// a loss: that write never completed, and every key keeps its previous value.
public struct DefaultsRecoveryReport: Sendable, Hashable, CustomStringConvertible {
    /// Bytes of committed records that failed their checksum and were dropped.
    public var corruptBytes = 0
    /// How many separate damaged regions were found.
    public var corruptRegions = 0
    /// Bytes of an incomplete write (a crash in the middle of an append) dropped from the tail.
    public var droppedTailBytes = 0
    /// How many times this process repaired the log after a writer died holding the writer lock.
    public var crashRepairs = 0
    /// The log's header failed its check and was rewritten (its records were kept).
    public var headerRepaired = false

    public init() {}

    /// Whether some committed data was lost to corruption.
    public var lostData: Bool { corruptBytes > 0 }

    /// Whether nothing at all was found.
    public var isClean: Bool {
        corruptBytes == 0 && droppedTailBytes == 0 && crashRepairs == 0 && !headerRepaired
    }

    mutating func merge(_ other: DefaultsRecoveryReport) {
        corruptBytes += other.corruptBytes
        corruptRegions += other.corruptRegions
        droppedTailBytes += other.droppedTailBytes
        crashRepairs += other.crashRepairs
        headerRepaired = headerRepaired || other.headerRepaired
    }

    public var description: String {
        if isClean { return "clean" }
        var parts: [String] = []
        if corruptBytes > 0 { parts.append("\(corruptBytes) corrupt bytes in \(corruptRegions) region(s) dropped (values lost)") }
        if droppedTailBytes > 0 { parts.append("\(droppedTailBytes) bytes of an interrupted write dropped") }
        if crashRepairs > 0 { parts.append("\(crashRepairs) repair(s) after a writer died") }
        if headerRepaired { parts.append("log header rewritten") }
        return parts.joined(separator: "; ")
    }
}
