import CBatonShims
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// The path of this executable, to spawn processes of itself.
package func selfExecutable() -> String {
    var buffer = [CChar](repeating: 0, count: 4096)
    let count = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    if count > 0 { return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) }
    return CommandLine.arguments[0]
}

/// The path of `baton-harness`, the executable of Baton's own test and benchmark workers:
/// `$BATON_HARNESS_EXECUTABLE` when set, else `baton-harness` in the directory of this
/// executable (`swift build` puts `baton` and `baton-harness` side by side in `.build/CONFIG/`).
package func harnessExecutable() -> String {
    if let path = environment("BATON_HARNESS_EXECUTABLE") { return path }
    let me = selfExecutable()
    guard let slash = me.lastIndex(of: "/") else { return "baton-harness" }
    return String(me[...slash]) + "baton-harness"
}

/// Nanoseconds on CLOCK_MONOTONIC (comparable across processes).
@inline(__always) package func monotonicNanoseconds() -> UInt64 { baton_monotonic_ns() }
