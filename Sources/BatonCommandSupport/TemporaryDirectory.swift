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

/// Removes `path` and everything under it, ignoring failures.
package func removeTree(_ path: String) {
    _ = try? FileManager.default.removeItem(atPath: path)
}
