import Foundation

/// How many of this process's descriptors are open on `path` (from /proc/self/fd; Linux).
package func openDescriptors(on path: String) -> Int {
    let target = URL(fileURLWithPath: path).resolvingSymlinksInPath().path
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return entries.filter { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0)) == target }.count
}
