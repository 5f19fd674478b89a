import Foundation
import BatonTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Bad values for every argument of the real `baton` executable. The commands and their
/// arguments are read from `baton --experimental-dump-help`, so a new option is covered without
/// changing this test.
@Suite("Command-line arguments", .timeLimit(.minutes(5)))
struct CommandLineArgumentTests {
    /// One argument of one command, from the dumped help.
    struct Argument: Sendable, CustomStringConvertible {
        var command: [String]
        var name: String
        var positional: Bool
        var isOptional: Bool
        var description: String { "baton \(command.joined(separator: " ")) \(positional ? "<\(name)>" : "--\(name)")" }
    }

    struct Command: Sendable {
        var path: [String]
        var arguments: [Argument]
        /// Shown in `--help` (not a hidden test worker).
        var isShown = true
    }

    /// Every leaf command of the CLI with its non-flag arguments.
    static func commands() async throws -> [Command] {
        let data = Data(try await runProgram(ChildProcess.executable, ["--experimental-dump-help"]).output)
        let root = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        var result: [Command] = []
        func walk(_ node: [String: Any], _ path: [String]) {
            let subcommands = node["subcommands"] as? [[String: Any]] ?? []
            if subcommands.isEmpty, !path.isEmpty, path != ["help"] {
                let arguments = (node["arguments"] as? [[String: Any]] ?? []).compactMap { argument -> Argument? in
                    let kind = argument["kind"] as? String
                    guard kind == "option" || kind == "positional" else { return nil }
                    let name = ((argument["preferredName"] as? [String: Any])?["name"] as? String) ?? (argument["valueName"] as? String) ?? "?"
                    return Argument(command: path, name: name, positional: kind == "positional", isOptional: argument["isOptional"] as? Bool ?? true)
                }
                result.append(Command(path: path, arguments: arguments, isShown: node["shouldDisplay"] as? Bool ?? true))
            }
            for subcommand in subcommands {
                walk(subcommand, path + [subcommand["commandName"] as? String ?? "?"])
            }
        }
        walk(try #require(root["command"] as? [String: Any]), [])
        return result
    }

    /// A benign value for an argument that is not under test.
    static func filler(_ argument: Argument, container: String) -> [UInt8] {
        switch argument.name {
        case "container": return Array(container.utf8)
        case "path", "database": return Array((container + "/test.sqlite").utf8)
        // Files a command may write: inside the container, never in the working directory.
        case "log", "timeline", "events": return Array((container + "/" + argument.name).utf8)
        default: return Array("1".utf8)
        }
    }

    /// The command line with `value` for `target` and fillers for the other required arguments.
    static func commandLine(_ command: Command, target: Argument, value: [UInt8], container: String) -> [[UInt8]] {
        var line = command.path.map { Array($0.utf8) }
        for argument in command.arguments {
            let isTarget = argument.name == target.name && argument.positional == target.positional
            guard isTarget || !argument.isOptional || argument.name == "container" else { continue }
            let bytes = isTarget ? value : filler(argument, container: container)
            // `--name=value`, so that a value such as `-1` is not taken for an option.
            line.append(argument.positional ? bytes : Array("--\(argument.name)=".utf8) + bytes)
        }
        return line
    }

    struct Outcome: Sendable {
        var line: String
        var status: Int32?
        var errors: [String]
    }

    /// Runs a command line to its end, killing it after `limit` seconds (`status` is then nil).
    static func run(_ line: [[UInt8]], container: String, limit: Double) async throws -> Outcome {
        let child = try ChildProcess(rawArguments: line, container: container)
        let text = line.map { String(decoding: $0, as: UTF8.self) }.joined(separator: " ")
        do {
            let status = try await child.wait(timeout: limit)
            return Outcome(line: text, status: status, errors: child.errorLines)
        } catch {
            child.signal(SIGKILL)
            _ = try? await child.wait()
            return Outcome(line: text, status: nil, errors: child.errorLines)
        }
    }

    /// Runs every line, two at a time (the other suites run meanwhile: no more load than that).
    static func runAll(_ lines: [[[UInt8]]], container: String, limit: Double) async throws -> [Outcome] {
        try await withThrowingTaskGroup(of: Outcome.self) { group in
            var outcomes: [Outcome] = []
            var next = 0
            for _ in 0..<min(2, lines.count) {
                let line = lines[next]
                next += 1
                group.addTask { try await run(line, container: container, limit: limit) }
            }
            while let outcome = try await group.next() {
                outcomes.append(outcome)
                if next < lines.count {
                    let line = lines[next]
                    next += 1
                    group.addTask { try await run(line, container: container, limit: limit) }
                }
            }
            return outcomes
        }
    }

    /// The arguments that take a number: `abc` is refused while parsing.
    static func numericArguments(_ commands: [Command], container: String) async throws -> [(Command, Argument)] {
        // Paths are never numbers (and `abc` must not become a file in the working directory).
        let paths: Set<String> = ["container", "path", "database", "log", "timeline", "events"]
        let candidates = commands.flatMap { command in command.arguments.filter { !paths.contains($0.name) }.map { (command, $0) } }
        let lines = candidates.map { commandLine($0.0, target: $0.1, value: Array("abc".utf8), container: "/nonexistent-baton-container") }
        let outcomes = try await runAll(lines, container: container, limit: 3)
        let rejected = Set(outcomes.filter { outcome in
            outcome.status == 64 && outcome.errors.contains { $0.contains("'abc'") && $0.contains("invalid") }
        }.map(\.line))
        return zip(candidates, lines).filter { rejected.contains($0.1.map { String(decoding: $0, as: UTF8.self) }.joined(separator: " ")) }.map(\.0)
    }

    /// A failure unless the run ended by itself, without a signal, and (when it failed) said
    /// why in one line.
    static func problem(_ outcome: Outcome) -> String? {
        guard let status = outcome.status else { return "`\(outcome.line)` was still running after the time limit" }
        if status > 128 { return "`\(outcome.line)` died with signal \(status - 128): \(outcome.errors.prefix(3))" }
        if status == 0 { return nil }
        let lines = outcome.errors.filter { !$0.trimmingCharacters(in: .whitespaces).isEmpty }
        if lines.count != 1 { return "`\(outcome.line)` exited \(status) with \(lines.count) lines of explanation instead of one: \(lines.prefix(4))" }
        return nil
    }

    @Test("NaN, infinities, huge and negative numbers are refused with one line, never a crash or a hang")
    func badNumbers() async throws {
        let directory = try TemporaryContainer()
        let commands = try await Self.commands()
        let numeric = try await Self.numericArguments(commands, container: directory.path)
        // Every numeric option named in the issue is found by the probe.
        for expected in ["timeout", "hold", "max-critical-wait", "poll", "lifetime", "count"] {
            #expect(numeric.contains { $0.1.name == expected }, "no numeric option --\(expected) found")
        }
        let values = ["nan", "inf", "-inf", "+infinity", "1e10", "1e300", "-1e300", "-1", "99999999999999999999999"]
        var lines: [[[UInt8]]] = []
        for (command, argument) in numeric {
            for value in values {
                lines.append(Self.commandLine(command, target: argument, value: Array(value.utf8), container: directory.path))
            }
        }
        let outcomes = try await Self.runAll(lines, container: directory.path, limit: 10)
        let problems = outcomes.compactMap(Self.problem)
        print("bad numbers: \(numeric.count) numeric arguments, \(outcomes.count) runs, \(problems.count) problems")
        #expect(problems.isEmpty, "\(problems.count) of \(outcomes.count) runs:\n\(problems.joined(separator: "\n"))")
        // Values that are not valid durations are refused, not taken for something else.
        let refusedNaN = outcomes.filter { $0.line.contains("=nan") }.allSatisfy { $0.status != 0 }
        #expect(refusedNaN, "a NaN was accepted")
    }

    @Test("invalid UTF-8 in any argument is refused with one line")
    func invalidUTF8() async throws {
        let directory = try TemporaryContainer()
        let commands = try await Self.commands()
        var lines: [[[UInt8]]] = []
        for command in commands {
            for argument in command.arguments where argument.name != "container" {
                lines.append(Self.commandLine(command, target: argument, value: [0x61, 0xFF, 0x62], container: directory.path))
            }
        }
        let outcomes = try await Self.runAll(lines, container: directory.path, limit: 30)
        var problems = outcomes.compactMap(Self.problem)
        for outcome in outcomes where outcome.status == 0 {
            problems.append("`\(outcome.line)` accepted an argument that is not UTF-8")
        }
        for outcome in outcomes where outcome.status != nil && outcome.status != 0 && !outcome.errors.contains(where: { $0.contains("UTF-8") }) {
            problems.append("`\(outcome.line)` failed without saying the argument is not UTF-8: \(outcome.errors.prefix(2))")
        }
        print("invalid UTF-8: \(outcomes.count) runs, \(problems.count) problems")
        #expect(problems.isEmpty, "\(problems.count) of \(outcomes.count) runs:\n\(problems.joined(separator: "\n"))")
    }

    @Test("two names that differ only in invalid bytes do not name the same signal")
    func invalidNamesDoNotCollide() async throws {
        let directory = try TemporaryContainer()
        let first = try ChildProcess(rawArguments: [Array("signal".utf8), Array("post".utf8), [0x78, 0xFE]], container: directory.path)
        let second = try ChildProcess(rawArguments: [Array("signal".utf8), Array("post".utf8), [0x78, 0xFF]], container: directory.path)
        #expect(try await first.wait() != 0)
        #expect(try await second.wait() != 0)
        #expect(second.errorLines.contains { $0.contains("UTF-8") })
    }

    @Test("NaN, infinities, huge and negative numbers, empty and oversized text as names: accepted as text or refused with one line")
    func badNames() async throws {
        let directory = try TemporaryContainer()
        let commands = try await Self.commands().filter(\.isShown)
        let numeric = try await Self.numericArguments(commands, container: directory.path)
        let paths: Set<String> = ["container", "path", "database", "log", "timeline", "events"]
        // Every name and text argument of the user-facing commands (numbers have their own test).
        let names = commands.flatMap { command in
            command.arguments.filter { argument in
                !paths.contains(argument.name) && !numeric.contains { $0.0.path == command.path && $0.1.name == argument.name }
            }.map { (command, $0) }
        }
        #expect(names.contains { $0.1.name == "name" } && names.contains { $0.1.name == "key" } && names.contains { $0.1.name == "kind" })
        let values = ["nan", "inf", "-inf", "1e300", "-1", "", String(repeating: "n", count: 5000)]
        var lines: [[[UInt8]]] = []
        var waits: Set<String> = []
        for (command, argument) in names {
            // Bounded: the commands that wait are given a timeout, a count and a hold of 0.
            var line = Self.commandLine(command, target: argument, value: [], container: directory.path)
            for (option, value) in [("timeout", "1"), ("count", "1"), ("hold", "0")] where option != argument.name && command.arguments.contains(where: { $0.name == option }) {
                line.append(Array("--\(option)=\(value)".utf8))
            }
            if !command.arguments.contains(where: { $0.name == "timeout" }) { waits.insert(command.path.joined(separator: " ")) }
            for value in values {
                lines.append(Self.commandLine(command, target: argument, value: Array(value.utf8), container: directory.path)
                    + line.dropFirst(Self.commandLine(command, target: argument, value: [], container: directory.path).count))
            }
        }
        let outcomes = try await Self.runAll(lines, container: directory.path, limit: 5)
        let problems = outcomes.compactMap { outcome -> String? in
            // A command without a timeout that accepted the name may run until stopped.
            if outcome.status == nil, waits.contains(where: { outcome.line.hasPrefix($0 + " ") }) { return nil }
            // Exit 1 without a message is the documented "timed out" or "not found" of a command
            // that accepted the name (`watch --timeout=1`, `inbox claim`).
            if outcome.status == 1, outcome.errors.allSatisfy({ $0.trimmingCharacters(in: .whitespaces).isEmpty }) { return nil }
            return Self.problem(outcome)
        }
        print("bad names: \(names.count) name arguments, \(outcomes.count) runs, \(problems.count) problems")
        #expect(problems.isEmpty, "\(problems.count) of \(outcomes.count) runs:\n\(problems.joined(separator: "\n"))")
    }
}
