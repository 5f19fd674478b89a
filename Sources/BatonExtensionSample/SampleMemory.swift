#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// This process's memory, as `PEAK_KB MAXRSS_KB PRIVATE_DIRTY_KB LINKAGE`: the peak resident set
/// of this program (VmHWM of /proc/self/status), getrusage's ru_maxrss (on Linux it also counts
/// the pages of the process that spawned this one with vfork, so spawn it through a fork), the
/// private dirty memory (/proc/self/smaps_rollup; the figure closest to what iOS counts), and how
/// the binary is linked (`static`/`dynamic` Swift runtime, `pie`/`nopie`).
enum SampleMemory {
    static func report() -> String {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        let maps = text("/proc/self/maps")
        let runtime = maps.contains("libswiftCore.so") ? "dynamic" : "static"
        return "\(field("/proc/self/status", "VmHWM:")) \(usage.ru_maxrss) \(field("/proc/self/smaps_rollup", "Private_Dirty:")) \(runtime)-\(isPIE() ? "pie" : "nopie")"
    }

    /// Whether this executable is position-independent (ELF type ET_DYN rather than ET_EXEC).
    private static func isPIE() -> Bool {
        let fd = open("/proc/self/exe", O_RDONLY)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var header = [UInt8](repeating: 0, count: 18)
        guard header.withUnsafeMutableBytes({ read(fd, $0.baseAddress, 18) }) == 18 else { return false }
        return header[16] == 3
    }

    private static func field(_ file: String, _ name: String) -> Int {
        for line in text(file).split(separator: "\n") where line.hasPrefix(name) {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? -1
        }
        return -1
    }

    private static func text(_ file: String) -> String {
        let fd = open(file, O_RDONLY)
        guard fd >= 0 else { return "" }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count <= 0 { break }
            bytes += buffer[0..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
