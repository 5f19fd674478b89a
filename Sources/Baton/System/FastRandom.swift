import Synchronization

/// A cheap generator for choices that need spread, not secrecy: where a select starts looking,
/// which free record a waiter tries first. SplitMix64 (Steele, Lea and Flood, "Fast Splittable
/// Pseudorandom Number Generators", OOPSLA 2014) over one atomic counter, seeded once from the
/// system generator. The system generator makes a system call per draw (`getrandom` on Linux),
/// which a channel operation made several times on its hot path.
enum FastRandom {
    private static let state = Atomic<UInt64>(UInt64.random(in: 0...UInt64.max))

    /// The next 64 random bits (any thread).
    static func next() -> UInt64 {
        var z = state.wrappingAdd(0x9E37_79B9_7F4A_7C15, ordering: .relaxed).newValue
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A number in `range` (not empty). The modulo bias (below 2^-40 for ranges of a few
    /// thousand) does not matter for a starting point.
    static func int(in range: Range<Int>) -> Int {
        precondition(!range.isEmpty, "FastRandom.int(in:) needs a range that is not empty")
        return range.lowerBound + Int(next() % UInt64(range.count))
    }
}
