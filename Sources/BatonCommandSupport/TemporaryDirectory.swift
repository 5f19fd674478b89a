import Baton
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// Creates a fresh directory `$TMPDIR/PREFIX-XXXXXX` (mode 0700) and returns its path.
/// - Throws: `systemCallFailed` when `mkdtemp` fails.
package func makeTemporaryDirectory(prefix: String) throws -> String {
    let base = environment("TMPDIR") ?? "/tmp"
    var template = Array("\(base)/\(prefix)-XXXXXX".utf8CString)
    guard let result = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
        throw BatonError(.systemCallFailed, "mkdtemp failed in \(base)")
    }
    return String(cString: result)
}

/// Removes `path` and everything under it, ignoring failures. A removal that met a file going
/// away (a child process deleting its own lock files on its way out: `removeItem` then stops at
/// the first file it no longer finds, leaving the rest) is tried again, 5 times at most.
package func removeTree(_ path: String) {
    for _ in 0..<5 {
        if (try? FileManager.default.removeItem(atPath: path)) != nil || !FileManager.default.fileExists(atPath: path) { return }
    }
}
