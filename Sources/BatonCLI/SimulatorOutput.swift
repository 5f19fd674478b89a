import ArgumentParser
import Baton
import BatonCommandSupport
import BatonSimulator
import CBatonShims
#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// Writes `text` to the file at `path` (created or truncated); the demo's and `simulate`'s outputs.
func write(_ text: String, to path: String) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw ValidationError("cannot write \(path): \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    var text = text
    let written = text.withUTF8 { buffer in POSIX.write(fd, buffer.baseAddress, buffer.count) }
    guard written == text.utf8.count else { throw ValidationError("cannot write \(path)") }
}

/// Checks, before a run, that a file can be written at `path` (its directory exists and is
/// writable; the path is not a directory), without creating it: a run of minutes must not end
/// with "cannot write".
func checkOutputPath(_ path: String, option: String) throws {
    var info = stat()
    if stat(path, &info) == 0 {
        if info.st_mode & S_IFMT == S_IFDIR { throw ValidationError("\(option) \(path) is a directory; pass a file path") }
        guard access(path, W_OK) == 0 else { throw ValidationError("\(option) \(path) is not writable") }
        return
    }
    let slash = path.lastIndex(of: "/")
    let directory = slash.map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
    guard stat(directory, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
        throw ValidationError("\(option) \(path): the directory \(directory) does not exist")
    }
    guard access(directory, W_OK | X_OK) == 0 else {
        throw ValidationError("\(option) \(path): the directory \(directory) is not writable")
    }
}

/// Checks a `--container DIR` the way every process of the run will open it, before any is
/// spawned (so a bad directory fails at once, in one line, instead of in every child).
func checkRunContainer(_ path: String?) throws {
    guard let path else { return }
    _ = try SharedContainer(path: path)
}

/// Prints a run's figures, extra lines, the timeline's path and the verdict, as text.
func emitTextReport(_ summary: [(String, String)], extra: [String], timeline: String?, failures: [String]) {
    emit("")
    for (name, value) in summary { emit("  \(name.padding(26))\(value)") }
    for line in extra { emit("  \(line)") }
    if let timeline { emit("  timeline: \(timeline)") }
    emit(failures.isEmpty ? "every invariant held" : "INVARIANTS FAILED:\n  " + failures.joined(separator: "\n  "))
}

/// Writes every event of a run to `path`, one JSON object a line, times relative to its start.
func writeEvents(_ timeline: Timeline, to path: String) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    var text = ""
    for event in timeline.events {
        var event = event
        event.time -= min(event.time, timeline.origin)
        text += String(decoding: try encoder.encode(event), as: UTF8.self) + "\n"
    }
    try write(text, to: path)
}
