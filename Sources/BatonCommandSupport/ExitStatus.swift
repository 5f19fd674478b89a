import ArgumentParser
import Baton
import BatonDatabase

/// The exit statuses of every `baton` subcommand: one convention, defined once.
///
/// 0 and 1 keep their shell meaning (success; an answer of "no", as `grep` and `test` use it).
/// 2 is left alone (shells use it for a builtin's misuse). The failures that a script may want to
/// tell apart (a deadline, another process in the way, the other side gone, damaged data) are
/// small numbers; the rest follow BSD's `sysexits.h`, whose 64 (`EX_USAGE`) is already what
/// ArgumentParser exits with for a usage error. 126, 127 and 128+N stay the shell's.
package enum ExitStatus: Int32, CaseIterable, Sendable {
    /// It worked.
    case success = 0
    /// The answer is no: the key is absent, the message was not claimed, a run (`demo`,
    /// `simulate`) broke an invariant.
    case absent = 1
    /// A deadline (`--timeout`) passed first.
    case timedOut = 3
    /// Another process holds what was asked for (a role held at a higher priority, a lock).
    case busy = 4
    /// The other side ended it: the channel is closed, the role was lost to another process.
    case ended = 5
    /// Stored data failed its checks (a checksum, a database integrity check).
    case damaged = 6
    /// A usage error: an unknown option, a value out of range, an invalid name or JSON text.
    case invalidInput = 64
    /// The container, database, channel or process named does not exist.
    case notFound = 66
    /// Something failed that should not have (a system call, the simulator's processes, an
    /// unexpected error).
    case internalFailure = 70
    /// Refused for safety: another user owns or may write the files, a link or a FIFO stands
    /// where a regular file should be, no permission.
    case refused = 77

    package var exitCode: ExitCode { ExitCode(rawValue) }

    /// What the status means, for `--help` and the README.
    package var meaning: String {
        switch self {
        case .success: return "success"
        case .absent: return "absent or false (key not set, message not claimed, an invariant failed)"
        case .timedOut: return "timed out (--timeout passed)"
        case .busy: return "busy (another process holds the role or lock)"
        case .ended: return "ended by the other side (channel closed, role lost)"
        case .damaged: return "damaged data found (checksum, integrity check)"
        case .invalidInput: return "invalid input (usage, option value, name, JSON)"
        case .notFound: return "not found (container, database, channel, process)"
        case .internalFailure: return "internal failure (a system call failed, a simulated process would not start)"
        case .refused: return "refused (permissions, another user's files, a link or FIFO)"
        }
    }

    /// The table shown by `baton --help`.
    package static var table: String {
        allCases.map { "  \(String($0.rawValue).padding(3)) \($0.meaning)" }.joined(separator: "\n")
            + "\n  128+N killed by signal N"
    }

    /// The status of a ``BatonError``.
    package init(_ code: BatonError.Code) {
        switch code {
        case .timedOut: self = .timedOut
        case .busy: self = .busy
        case .lost, .closed: self = .ended
        case .corrupt, .malformedFrame, .notADatabase: self = .damaged
        case .invalidName, .invalidArgument, .pathTooLong: self = .invalidInput
        case .notFound, .notADirectory: self = .notFound
        case .notWritable, .ownedByAnotherUser, .writableByOthers, .symbolicLink, .notARegularFile: self = .refused
        case .systemCallFailed, .simulationFailed: self = .internalFailure
        default: self = .internalFailure
        }
    }
}

/// How a command ends with a status other than success and an explanation: the message is
/// printed as one line on standard error (every absence and every timeout says so).
package struct CommandOutcome: Error, Sendable {
    package var status: ExitStatus
    package var message: String

    package init(_ status: ExitStatus, _ message: String) {
        self.status = status
        self.message = message
    }

    /// A `--timeout` that passed: `what` says what was awaited.
    package static func timedOut(_ what: String, after seconds: Double?) -> CommandOutcome {
        CommandOutcome(.timedOut, "timed out: \(what)\(seconds.map { " within \(formatSeconds($0)) s" } ?? "")")
    }
}

package func formatSeconds(_ seconds: Double) -> String {
    seconds == seconds.rounded() ? String(Int(seconds)) : String(seconds)
}
