import Foundation

/// This process's threads as Linux lists them (`/proc/self/task`; empty where there is no such
/// directory): for tests that count a named thread, and for failure messages that say what each
/// thread waits in.
package enum ProcessThreads {
    /// Each thread's id, its name (`comm`, at most 15 bytes) and the kernel function it sleeps
    /// in (`wchan`; `0` while it runs).
    package static func all() -> [(id: Int32, name: String, waitChannel: String)] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.compactMap { task in
            func read(_ file: String) -> String {
                ((try? String(contentsOfFile: "/proc/self/task/\(task)/\(file)", encoding: .utf8)) ?? "?")
                    .trimmingCharacters(in: .whitespacesAndNewlines)
            }
            guard let id = Int32(task) else { return nil }
            return (id, read("comm"), read("wchan"))
        }
    }
}
