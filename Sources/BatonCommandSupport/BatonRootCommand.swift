import ArgumentParser
import Baton
import BatonSimulator
import CBatonHarness

/// The root command of a Baton executable (`baton`, `baton-harness`): one way to parse, run,
/// report an error on one line of standard error, and exit with an ``ExitStatus``.
///
/// With `BATON_DIE_WITH_PARENT` set, the process dies with its parent (tests set it).
package protocol BatonRootCommand: AsyncParsableCommand {}

extension BatonRootCommand {
    /// The whole of `main()`: parses, runs, and ends with the status of ``ExitStatus``.
    package static func runMain() async {
        if environment("BATON_DIE_WITH_PARENT") != nil { _ = baton_exit_with_parent() }
        if let index = ArgumentCheck.firstInvalidUTF8Argument() {
            fail("argument \(index) is not valid UTF-8; names and values must be UTF-8 text (invalid bytes would make two different names the same)")
        }
        let command: any ParsableCommand
        do {
            command = try parseAsRoot()
        } catch {
            // A usage error found while parsing: ArgumentParser's message names the option and
            // ends with the subcommand's usage.
            let code = exitCode(for: error)
            if code == .validationFailure {
                // One line: ArgumentParser's message, then the subcommand's usage and where its
                // help is, folded into the same line (scripts read one line per failure).
                let lines = fullMessage(for: error).split(whereSeparator: \.isNewline).map(String.init)
                let usage = lines.first { $0.hasPrefix("Usage: ") }.map { String($0.dropFirst("Usage: ".count)) }
                let see = lines.lazy.map { String($0.drop { $0 == " " }) }.first { $0.hasPrefix("See '") }
                var line = lines.first ?? "Error: invalid arguments"
                if let usage { line += " (usage: \(usage)\(see.map { "; " + $0.prefix(1).lowercased() + $0.dropFirst() } ?? ""))" }
                FileHandleOutput.standardError(oneLine(line))
                Self.exit(withError: ExitStatus.invalidInput.exitCode)
            }
            exit(withError: error)
        }
        do {
            var command = command
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            finish(type(of: command), error)
        }
    }

    /// Ends the process after `command` threw `error`: one line on standard error (for invalid
    /// input, with the subcommand's usage) and the status of ``ExitStatus``.
    package static func finish(_ command: any ParsableCommand.Type, _ error: any Error) -> Never {
        switch error {
        case let outcome as CommandOutcome:
            FileHandleOutput.standardError(oneLine(outcome.message))
            Self.exit(withError: outcome.status.exitCode)
        case let error as BatonError:
            let status = ExitStatus(error.code)
            if status == .invalidInput { usageError("\(error.code): \(error.message)", command) }
            FileHandleOutput.standardError(oneLine("Error: \(error)"))
            Self.exit(withError: status.exitCode)
        case let error as ValidationError:
            usageError(error.message, command)
        case let error as DecodingError:
            FileHandleOutput.standardError(oneLine("Error: " + describeDecodingError(error)))
            Self.exit(withError: ExitStatus.damaged.exitCode)
        default:
            let code = exitCode(for: error)
            if code == .success || error is ExitCode || error is CleanExit { exit(withError: error) }
            FileHandleOutput.standardError(oneLine("Error: \(message(for: error))"))
            Self.exit(withError: ExitStatus.internalFailure.exitCode)
        }
    }

    /// A usage error found after parsing: the message and the subcommand's usage, in one line
    /// like a usage error found while parsing (status 64).
    package static func usageError(_ message: String, _ command: any ParsableCommand.Type) -> Never {
        let path = commandPath(command)
        let usage = oneLine(usageString(for: command).trimmingTrailingNewlines)
        FileHandleOutput.standardError(oneLine("Error: \(message) (usage: \(usage); see '\(path) --help' for more information.)"))
        Self.exit(withError: ExitStatus.invalidInput.exitCode)
    }

    /// `baton role acquire` for ``RoleCommand/Acquire``.
    package static func commandPath(_ command: any ParsableCommand.Type) -> String {
        func search(_ node: any ParsableCommand.Type, _ path: [String]) -> [String]? {
            let name = node._commandName
            let here = path + [name]
            if ObjectIdentifier(node) == ObjectIdentifier(command) { return here }
            for child in node.configuration.subcommands {
                if let found = search(child, here) { return found }
            }
            return nil
        }
        return (search(Self.self, []) ?? [Self._commandName]).joined(separator: " ")
    }

    package static func oneLine(_ text: String) -> String {
        text.split(whereSeparator: \.isNewline).joined(separator: " ")
    }

    /// Prints `Error: <message>` as one line on standard error and exits.
    package static func fail(_ message: String, code: ExitCode = ExitStatus.invalidInput.exitCode) -> Never {
        FileHandleOutput.standardError(oneLine("Error: " + message))
        Self.exit(withError: code)
    }
}
